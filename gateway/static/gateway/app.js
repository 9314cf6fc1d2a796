// The job page: start jobs with an Idempotency-Key, resend to see the replay, and watch each
// job over its WebSocket, resuming from the last seq received after any disconnect.
"use strict";

const STAGES = {
  scan: ["vision", "rule", "answer", "reward", "done"],
  chat: ["answer", "done"],
};
const FINAL_SEQ = 51;
const TERMINAL_CLOSE = { 4400: "bad parameters", 4401: "not logged in", 4403: "forbidden", 4404: "no such job" };

function csrfToken() {
  const match = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

let lastRequest = null;

async function sendJobRequest(request) {
  const response = await fetch("/api/jobs/", {
    method: "POST",
    credentials: "same-origin",
    headers: {
      "Content-Type": "application/json",
      "Idempotency-Key": request.key,
      "X-CSRFToken": csrfToken(),
    },
    body: request.body,
  });
  const replayed = response.headers.get("Idempotent-Replayed") === "true";
  const body = await response.json();
  const result = document.getElementById("request-result");
  result.textContent = `HTTP ${response.status}${replayed ? " — replayed (Idempotent-Replayed: true), no new job" : " — executed"}`;
  result.className = replayed ? "replayed" : "";
  if (response.status === 201) {
    watchJob(body);
  } else {
    result.textContent += `: ${body.title || ""} ${body.detail || ""}`;
  }
}

document.getElementById("start-job").addEventListener("click", () => {
  let payload;
  try {
    payload = JSON.parse(document.getElementById("payload").value || "{}");
  } catch (error) {
    document.getElementById("last-request").hidden = false;
    document.getElementById("request-result").textContent = `Payload is not JSON: ${error.message}`;
    return;
  }
  const domain = document.getElementById("domain").value;
  lastRequest = { key: crypto.randomUUID(), body: JSON.stringify({ domain, payload }) };
  document.getElementById("sent-key").textContent = lastRequest.key;
  document.getElementById("last-request").hidden = false;
  sendJobRequest(lastRequest);
});

document.getElementById("send-again").addEventListener("click", () => {
  if (lastRequest) sendJobRequest(lastRequest);
});

const watched = new Map();

function watchJob(job) {
  if (watched.has(job.job_id)) {
    watched.get(job.job_id).card.classList.add("seen-again");
    return;
  }
  const card = document.getElementById("job-template").content.firstElementChild.cloneNode(true);
  card.dataset.jobId = job.job_id;
  card.querySelector(".domain").textContent = job.domain;
  card.querySelector(".job-id").textContent = job.job_id;
  const stages = card.querySelector(".stages");
  for (const stage of STAGES[job.domain] || []) {
    const chip = document.createElement("span");
    chip.className = "stage";
    chip.dataset.stage = stage;
    chip.textContent = stage;
    stages.append(chip);
  }
  document.getElementById("jobs").prepend(card);
  const state = { job, card, lastSeq: 0, seen: new Set(), attempts: 0, finished: false, socket: null };
  watched.set(job.job_id, state);
  connect(state);
}

function setConnection(state, name, text) {
  const badge = state.card.querySelector(".connection");
  badge.dataset.state = name;
  badge.textContent = text;
}

function connect(state) {
  const url = new URL(state.job.ws_url, window.location.href);
  url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
  url.host = window.location.host; // the page's own origin: cookies and origin checks match
  url.searchParams.set("last_seq", String(state.lastSeq));
  const socket = new WebSocket(url);
  state.socket = socket;
  setConnection(state, state.attempts ? "reconnecting" : "connecting", state.attempts ? "reconnecting…" : "connecting…");
  socket.addEventListener("open", () => {
    state.attempts = 0;
    setConnection(state, "live", "live");
  });
  socket.addEventListener("message", (message) => onFrame(state, JSON.parse(message.data)));
  socket.addEventListener("close", (event) => {
    if (state.finished) {
      setConnection(state, "closed", "done");
      return;
    }
    if (TERMINAL_CLOSE[event.code]) {
      setConnection(state, "error", `closed: ${TERMINAL_CLOSE[event.code]}`);
      return;
    }
    // Anything else (server restart, 4008 too slow, network): resume from the last seq.
    state.attempts += 1;
    const delay = event.code === 4008 ? 0 : Math.min(5000, 200 * 2 ** Math.min(state.attempts, 5));
    setConnection(state, "reconnecting", `reconnecting… (${state.attempts})`);
    setTimeout(() => connect(state), delay);
  });
}

function logLine(state, text, className) {
  const line = document.createElement("li");
  line.textContent = text;
  if (className) line.className = className;
  const log = state.card.querySelector(".log");
  log.append(line);
  log.scrollTop = log.scrollHeight;
  return line;
}

function showProgress(state, stage, seq) {
  const stages = STAGES[state.job.domain] || [];
  const index = stages.indexOf(stage);
  for (const chip of state.card.querySelectorAll(".stage")) {
    const chipIndex = stages.indexOf(chip.dataset.stage);
    chip.classList.toggle("done", chipIndex < index || seq >= FINAL_SEQ);
    chip.classList.toggle("active", chipIndex === index && seq < FINAL_SEQ);
  }
  const percent = seq >= FINAL_SEQ ? 100 : Math.round((100 * Math.max(index, 0)) / stages.length);
  state.card.querySelector("progress").value = percent;
  state.card.querySelector(".percent").textContent = `${percent} %`;
}

function onFrame(state, frame) {
  if (frame.type === "event") {
    // Every frame is logged as it arrives; a repeat would be shown, never hidden.
    const repeat = state.seen.has(frame.seq);
    state.seen.add(frame.seq);
    const line = logLine(state, `#${frame.seq} ${frame.stage} ${JSON.stringify(frame.data)}`, repeat ? "duplicate" : "");
    line.dataset.seq = frame.seq;
    state.lastSeq = Math.max(state.lastSeq, frame.seq);
    showProgress(state, frame.stage, frame.seq);
    if (frame.seq >= FINAL_SEQ) {
      state.finished = true;
      state.socket.close(1000);
    }
  } else if (frame.type === "reset") {
    const snapshot = frame.state || {};
    logLine(state, `reset (recovered: false): state ${JSON.stringify(snapshot)}`, "reset");
    state.lastSeq = Math.max(state.lastSeq, snapshot.seq || 0);
    if (snapshot.stage) showProgress(state, snapshot.stage, snapshot.seq || 0);
  } else if (frame.type === "error") {
    logLine(state, `error ${frame.code}: ${frame.detail}`, "reset");
  }
}

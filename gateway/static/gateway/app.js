// The job page: start jobs with an Idempotency-Key, resend to see the replay, and watch each
// job over its WebSocket with jobstream.js (loaded first), which resumes from the last seq
// received after any disconnect. The bar shows the latest event's own `data.progress`, which
// the pipelines set on every event.
"use strict";

// Every registered job type, as the server declares it (gateway.views.index): its stages in
// order (the final "done" last), the payload it reads, and a word about it. The page offers the
// example payload, so that a job started with the defaults does what it says.
const JOB_TYPES = JSON.parse(document.getElementById("job-types").textContent);
const STAGES = Object.fromEntries(JOB_TYPES.map((t) => [t.name, t.stages]));
const DEFAULT_PAYLOADS = Object.fromEntries(JOB_TYPES.map((t) => [t.name, t.example_payload]));
const PAYLOAD_HINTS = Object.fromEntries(JOB_TYPES.map((t) => [t.name, t.description]));

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
    showJob(body);
  } else {
    result.textContent += `: ${body.title || ""} ${body.detail || ""}`;
  }
}

const domainSelect = document.getElementById("domain");
const payloadInput = document.getElementById("payload");

function offerPayload(previousDomain) {
  const domain = domainSelect.value;
  // Only replace what the page itself put there: a payload the user typed stays.
  const untouched = !payloadInput.value.trim() || payloadInput.value === JSON.stringify(DEFAULT_PAYLOADS[previousDomain] || {});
  if (untouched) payloadInput.value = JSON.stringify(DEFAULT_PAYLOADS[domain] || {});
  document.getElementById("payload-hint").textContent = PAYLOAD_HINTS[domain] || "";
}

let shownDomain = domainSelect.value;
domainSelect.addEventListener("change", () => {
  offerPayload(shownDomain);
  shownDomain = domainSelect.value;
});
offerPayload(null); // the input's initial "{}" is the page's own: replace it

document.getElementById("start-job").addEventListener("click", () => {
  let payload;
  try {
    payload = JSON.parse(payloadInput.value || "{}");
  } catch (error) {
    document.getElementById("last-request").hidden = false;
    document.getElementById("request-result").textContent = `Payload is not JSON: ${error.message}`;
    return;
  }
  const domain = domainSelect.value;
  lastRequest = { key: crypto.randomUUID(), body: JSON.stringify({ domain, payload }) };
  document.getElementById("sent-key").textContent = lastRequest.key;
  document.getElementById("last-request").hidden = false;
  sendJobRequest(lastRequest);
});

document.getElementById("send-again").addEventListener("click", () => {
  if (lastRequest) sendJobRequest(lastRequest);
});

const watched = new Map();

function showJob(job) {
  if (watched.has(job.job_id)) {
    // A replay answers with the job already on the page: point at its card, flashing it again
    // on every replay (removing the class and forcing a reflow restarts the animation).
    const card = watched.get(job.job_id).card;
    card.classList.remove("seen-again");
    void card.offsetWidth;
    card.classList.add("seen-again");
    card.scrollIntoView({ block: "nearest" });
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
  const state = { job, card, progress: 0, stream: null };
  watched.set(job.job_id, state);
  const url = new URL(job.ws_url, window.location.href);
  url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
  url.host = window.location.host; // the page's own origin: cookies and origin checks match
  state.stream = JobStream.watch(url.href, {
    onEvent: (frame) => onEvent(state, frame),
    // The client drops a repeat (seq <= the last one); the page still shows it, never hides it.
    onDropped: (frame) => {
      logLine(state, `#${frame.seq} ${frame.stage} ${JSON.stringify(frame.data)}`, "duplicate").dataset.seq = frame.seq;
    },
    onReset: (snapshot) => onReset(state, snapshot),
    onError: (error) => logLine(state, `error ${error.code}: ${error.detail}`, "reset"),
    onStatus: (status, info) => showConnection(state, status, info),
  });
}

function showConnection(state, status, info) {
  const [name, text] = {
    connecting: ["connecting", "connecting…"],
    open: ["live", "live"],
    reconnecting: ["reconnecting", `reconnecting… (${info.attempt})`],
    closed: info.finished ? ["closed", "done"] : info.error ? ["error", `closed: ${info.error}`] : ["closed", "closed"],
  }[status];
  const badge = state.card.querySelector(".connection");
  badge.dataset.state = name;
  badge.textContent = text;
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

function showProgress(state, stage, seq, data) {
  const stages = STAGES[state.job.domain] || [];
  const index = stages.indexOf(stage);
  const final = Boolean(data && data.final);
  for (const chip of state.card.querySelectorAll(".stage")) {
    const chipIndex = stages.indexOf(chip.dataset.stage);
    chip.classList.toggle("done", chipIndex < index || final);
    chip.classList.toggle("active", chipIndex === index && !final);
  }
  // The event says how far the job is; the page does not guess it from the stage, which put
  // scan a stage behind and kept chat at 0 % through its whole answer. An event without a
  // progress leaves the bar where it was, except the final one, which ends the job.
  const reported = data ? data.progress : undefined;
  let percent = state.progress;
  if (typeof reported === "number" && Number.isFinite(reported)) {
    percent = Math.min(100, Math.max(0, reported));
  } else if (final) {
    percent = 100;
  }
  state.progress = percent;
  const bar = state.card.querySelector("progress");
  bar.value = percent;
  bar.setAttribute("aria-valuenow", String(percent));
  state.card.querySelector(".percent").textContent = `${Math.round(percent)} %`;
}

function showAnswer(state, text, gap) {
  // Chat's answer chunks, concatenated in seq order, are its answer: it grows as they arrive.
  if (typeof text !== "string") return;
  const answer = state.card.querySelector(".answer");
  answer.hidden = false;
  answer.textContent += (gap ? " […] " : "") + text;
}

function onEvent(state, frame) {
  const line = logLine(state, `#${frame.seq} ${frame.stage} ${JSON.stringify(frame.data)}`, "");
  line.dataset.seq = frame.seq;
  showProgress(state, frame.stage, frame.seq, frame.data);
  showAnswer(state, (frame.data || {}).text, false);
}

function onReset(state, snapshot) {
  logLine(state, `reset (recovered: false): state ${JSON.stringify(snapshot)}`, "reset");
  if (snapshot.stage) showProgress(state, snapshot.stage, snapshot.seq || 0, snapshot.data);
  // The chunks between the last one shown and the snapshot's are gone: the answer says so.
  showAnswer(state, (snapshot.data || {}).text, true);
}

// The job page: start jobs with an Idempotency-Key, resend to see the replay, and watch each
// job over its WebSocket with jobstream.js (loaded first), which resumes from the last seq
// received after any disconnect. The bar shows the latest event's own `data.progress`, which
// the pipelines set on every event.
//
// On load the page lists the user's recent jobs (GET /api/jobs/, whoever started them: this
// page, the API or the project's code) with their stages (the detail's `stages`), and watches
// each live one from the last seq this tab showed (kept in sessionStorage: a reload resumes,
// it does not replay). It then asks for the newest page of the list every couple of seconds,
// so that a job started elsewhere (or retried elsewhere) shows up without a reload. Each card
// has a Cancel button while its job is live and a Retry button once it failed, timed out or was
// cancelled and has no retry yet. A WAITING job's card says what it waits for and until when;
// waiting for a signal, it has a button per signal awaited, which sends it (POST
// /api/jobs/<id>/signals/<name>/). A job's parent and children are links to their cards. Text
// from the server goes in with textContent.
"use strict";

// Every registered job type, as the server declares it (gateway.views.index): its stages in
// order (the final "done" last), the payload it reads, and a word about it. The page offers the
// example payload, so that a job started with the defaults does what it says.
const JOB_TYPES = JSON.parse(document.getElementById("job-types").textContent);
const STAGES = Object.fromEntries(JOB_TYPES.map((t) => [t.name, t.stages]));
const DEFAULT_PAYLOADS = Object.fromEntries(JOB_TYPES.map((t) => [t.name, t.example_payload]));
const PAYLOAD_HINTS = Object.fromEntries(JOB_TYPES.map((t) => [t.name, t.description]));

// Not ended: a WAITING job's stage waits (a sleep, a signal, its children) and holds no worker.
const LIVE = ["PENDING", "RUNNING", "WAITING"];
const ENDED = ["COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED"];
const RETRYABLE = ["FAILED", "TIMED_OUT", "CANCELLED"];
const STATE_WORDS = {
  PENDING: "pending",
  RUNNING: "running",
  WAITING: "waiting",
  COMPLETED: "completed",
  FAILED: "failed",
  TIMED_OUT: "timed out",
  CANCELLED: "cancelled",
};
const FINAL_STAGE = "done";
// Jobs listed per page of the list (the API's page_size): each listed job costs a detail request.
const LIST_PAGE_SIZE = 10;
// A live job quiet this long may be waiting for a stage's retry, which sends no event: the page
// asks for its detail then, and again less and less often while it stays quiet.
const QUIET_FIRST_MS = 2000;
const QUIET_MAX_MS = 16000;
// A job's children linked on its card (the count says how many in all).
const SHOWN_CHILDREN = 10;

function csrfToken() {
  const match = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

// One call of the jobs API: {ok, status, body, replayed, problem}. `status` 0: no answer came.
// A refusal's `problem` is its problem+json title and detail, with Retry-After when sent.
async function callApi(url, { method = "GET", key = null, body = null } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    headers["X-CSRFToken"] = csrfToken();
  }
  if (key) headers["Idempotency-Key"] = key;
  let response;
  try {
    response = await fetch(url, { method, credentials: "same-origin", headers, body });
  } catch (error) {
    return { ok: false, status: 0, body: null, replayed: false, problem: `no answer from the server (${error.message})` };
  }
  let data = null;
  try {
    data = await response.json();
  } catch (error) {
    data = null; // not JSON (a proxy's error page): the status says enough
  }
  const answer = {
    ok: response.ok,
    status: response.status,
    body: data,
    replayed: response.headers.get("Idempotent-Replayed") === "true",
    retryAfter: Number(response.headers.get("Retry-After")) || 0,
  };
  if (!response.ok) answer.problem = problemText(answer);
  return answer;
}

function problemText(answer) {
  const body = answer.body && typeof answer.body === "object" ? answer.body : {};
  let text = `HTTP ${answer.status}`;
  if (body.title) text += ` ${body.title}`;
  if (body.detail) text += `: ${body.detail}`;
  if (answer.retryAfter) text += ` (try again in ${answer.retryAfter} s)`;
  return text;
}

// The last seq each job's card showed, per tab: a reload resumes each live job from it.
const SEQ_KEY_PREFIX = "jobstream:last-seq:";

function storedSeq(jobId) {
  try {
    return Math.max(0, Math.floor(Number(sessionStorage.getItem(SEQ_KEY_PREFIX + jobId)) || 0));
  } catch (error) {
    return 0; // storage refused (a privacy mode): the job is watched from its start
  }
}

function storeSeq(jobId, seq) {
  try {
    if (seq > storedSeq(jobId)) sessionStorage.setItem(SEQ_KEY_PREFIX + jobId, String(seq));
  } catch (error) {
    // storage full or refused: a reload shows the job from its start
  }
}

function forgetSeq(jobId) {
  try {
    sessionStorage.removeItem(SEQ_KEY_PREFIX + jobId);
  } catch (error) {
    // nothing to forget
  }
}

const announcer = document.getElementById("announcer");

function announce(text) {
  announcer.textContent = text;
}

// -- starting a job -----------------------------------------------------------------------------

let lastRequest = null;

async function sendJobRequest(request) {
  const answer = await callApi("/api/jobs/", { method: "POST", key: request.key, body: request.body });
  const result = document.getElementById("request-result");
  result.textContent = `HTTP ${answer.status}${answer.replayed ? " — replayed (Idempotent-Replayed: true), no new job" : " — executed"}`;
  result.className = answer.replayed ? "replayed" : "";
  if (answer.status === 201) {
    showJob(answer.body, { replayed: answer.replayed });
  } else {
    const body = answer.body || {};
    result.textContent += `: ${body.title || ""} ${body.detail || answer.problem || ""}`;
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

// -- the cards ----------------------------------------------------------------------------------

const watched = new Map(); // job id -> its card's state

function showJob(job, { replayed }) {
  const shown = watched.get(String(job.job_id));
  if (shown) {
    // Already on the page: a replay points at it; a new job the list brought first is there.
    if (replayed) pointAt(shown);
    return;
  }
  watch(addCard(job, { after: null }));
}

function pointAt(state) {
  // A replay answers with the job already on the page: point at its card, flashing it again
  // on every replay (removing the class and forcing a reflow restarts the animation).
  const card = state.card;
  card.classList.remove("seen-again");
  void card.offsetWidth;
  card.classList.add("seen-again");
  card.scrollIntoView({ block: "nearest" });
}

function shortId(jobId) {
  return String(jobId).slice(0, 8);
}

// A card for the job: first on the page (`after` null), after another job's card (`after` its
// state: the list is newest first), or last (`after` "end": an older page of the list).
function addCard(job, { after }) {
  const card = document.getElementById("job-template").content.firstElementChild.cloneNode(true);
  const jobId = String(job.job_id);
  card.id = `job-${jobId}`;
  card.dataset.jobId = jobId;
  card.querySelector("h3").id = `job-${jobId}-title`;
  card.setAttribute("aria-labelledby", `job-${jobId}-title`);
  card.querySelector(".domain").textContent = job.domain;
  card.querySelector(".job-id").textContent = jobId;
  const state = {
    job,
    card,
    progress: 0,
    stream: null,
    jobState: null,
    shownSeq: 0, // the newest event shown: an older detail does not undo it
    chips: new Map(),
    quietTimer: null,
    quietDelay: QUIET_FIRST_MS,
    detailAsked: false,
    retryKey: null, // the key of a retry whose answer never came: sent again on the next press
    retriedAs: null,
    cancelling: false, // a cancel was accepted; the run has not stopped yet
    waitingFor: null, // what its waiting stage waits for, as its detail said ("signal:approve,reject")
    runAfter: null, // when a WAITING job resumes (or a delayed one starts), if known
    signals: [], // the signals its type declares, as its detail said
    signalKeys: {}, // by signal name: the key of a send whose answer never came, sent again on the next press
    signalledFor: null, // the wait a signal was sent for: its buttons stay hidden until the job runs
  };
  for (const stage of STAGES[job.domain] || []) addChip(state, stage);
  // Many cards, one name each: the job's, for whoever reads the page by its controls.
  card.querySelector("progress").setAttribute("aria-label", `Progress of the ${job.domain} job ${shortId(jobId)}`);
  card.querySelector(".cancel").setAttribute("aria-label", `Cancel the ${job.domain} job ${shortId(jobId)}`);
  card.querySelector(".retry").setAttribute("aria-label", `Retry the ${job.domain} job ${shortId(jobId)}`);
  card.querySelector(".cancel").addEventListener("click", () => cancelJob(state));
  card.querySelector(".retry").addEventListener("click", () => retryJob(state));
  card.querySelector(".signals").setAttribute("aria-label", `Signals the ${job.domain} job ${shortId(jobId)} waits for`);
  card.querySelector(".connection").hidden = true; // until a stream is opened
  const jobs = document.getElementById("jobs");
  if (after === null) jobs.prepend(card);
  else if (after === "end") jobs.append(card);
  else after.card.after(card);
  watched.set(jobId, state);
  showJobsStatus();
  setJobState(state, job.state || "PENDING", { quiet: true });
  showChain(state, job);
  // Its retry's card came first (the list is newest first): it says what retried this one.
  for (const other of watched.values()) {
    if (other.job.retry_of && String(other.job.retry_of) === jobId) showRetriedAs(state, String(other.job.job_id));
  }
  return state;
}

function addChip(state, stage) {
  const chip = document.createElement("span");
  chip.className = "stage";
  chip.dataset.stage = stage;
  chip.dataset.state = "PENDING";
  const name = document.createElement("span");
  name.className = "stage-name";
  name.textContent = stage;
  const note = document.createElement("span");
  note.className = "stage-note";
  chip.append(name, note);
  // A stage the page did not know of (a type changed since): before the final chip. A space
  // after each chip, which the flex layout does not draw, keeps their texts apart when read.
  const final = state.chips.get(FINAL_STAGE);
  if (final && stage !== FINAL_STAGE) final.before(chip, " ");
  else state.card.querySelector(".stages").append(chip, " ");
  state.chips.set(stage, chip);
  return chip;
}

function setChip(chip, stageState, note) {
  chip.dataset.state = stageState;
  chip.querySelector(".stage-note").textContent = note ? ` · ${note}` : "";
}

function stageOrder(state) {
  return [...state.card.querySelectorAll(".stage")].map((chip) => chip.dataset.stage);
}

function setJobState(state, jobState, { quiet = false } = {}) {
  const previous = state.jobState;
  if (ENDED.includes(previous)) return; // a final state is never left
  if (previous === "RUNNING" && jobState === "PENDING") return; // an older answer
  if (previous === "WAITING" && jobState === "PENDING") return; // an older answer too
  if (!(jobState in STATE_WORDS)) return;
  state.jobState = jobState;
  if (jobState !== "WAITING") state.signalledFor = null; // it ran: a new wait gets its buttons
  const card = state.card;
  card.dataset.state = jobState;
  const badge = card.querySelector(".job-state");
  badge.textContent = state.cancelling && LIVE.includes(jobState) ? "cancelling…" : STATE_WORDS[jobState];
  const cancel = card.querySelector(".cancel");
  cancel.hidden = !LIVE.includes(jobState);
  card.querySelector(".retry").hidden = !RETRYABLE.includes(jobState) || state.retriedAs !== null;
  showWait(state);
  if (ENDED.includes(jobState)) {
    clearTimeout(state.quietTimer);
    forgetSeq(state.job.job_id);
    endBar(state, jobState);
    if (jobState === "COMPLETED") {
      for (const chip of state.chips.values()) if (chip.dataset.state !== "COMPLETED") setChip(chip, "COMPLETED", "");
    } else {
      const final = state.chips.get(FINAL_STAGE);
      if (final) {
        final.dataset.state = jobState;
        final.querySelector(".stage-name").textContent = STATE_WORDS[jobState];
      }
    }
  }
  if (!quiet && previous !== jobState) announce(`${state.job.domain} job ${shortId(state.job.job_id)}: ${STATE_WORDS[jobState]}`);
}

// The card's retry chain: the job it retries, the job that retried it (each a link to its card).
function chainPart(state, name) {
  const chain = state.card.querySelector(".chain");
  chain.hidden = false;
  let part = chain.querySelector(`.${name}`);
  if (!part) {
    part = document.createElement("span");
    part.className = name;
    // "Retry of …", then "Retried as …", with a separator in the text itself (not drawn by the
    // stylesheet): read aloud or copied, the two do not run together.
    const first = name === "retry-of" ? part : chain.querySelector(".retry-of");
    const second = name === "retried-as" ? part : chain.querySelector(".retried-as");
    chain.replaceChildren(...(first && second ? [first, " · ", second] : [part]));
  }
  return part;
}

// From a job as the list, its detail or a retry's answer shows it: `retry_of` (the job it
// retries) and `retried_by` (its retry, wherever it was made: this page, another tab, the API,
// the admin). Either may be absent (an older server): read as "none".
function showChain(state, job) {
  if (job.retry_of) showRetryOf(state, String(job.retry_of));
  if (job.retried_by) showRetriedAs(state, String(job.retried_by));
}

function showRetryOf(state, oldId) {
  chainPart(state, "retry-of").replaceChildren("Retry of ", jobLink(oldId));
  const old = watched.get(oldId);
  if (old) showRetriedAs(old, String(state.job.job_id));
}

function showRetriedAs(state, newId) {
  if (state.retriedAs === newId) return;
  state.retriedAs = newId;
  state.card.querySelector(".retry").hidden = true; // retry the newest of the chain, on its card
  chainPart(state, "retried-as").replaceChildren("Retried as ", jobLink(newId));
}

function jobLink(jobId) {
  const link = document.createElement("a");
  link.href = `#job-${jobId}`;
  const code = document.createElement("code");
  code.textContent = shortId(jobId);
  link.append(code);
  return link;
}

function showProblem(state, text) {
  const problem = state.card.querySelector(".problem");
  problem.hidden = !text;
  problem.textContent = text || "";
  if (text) announce(`${state.job.domain} job ${shortId(state.job.job_id)}: ${text}`);
}

function showActionKey(state, key, what = "Retry") {
  const sent = state.card.querySelector(".action-key");
  sent.hidden = false;
  sent.querySelector(".action-what").textContent = what;
  sent.querySelector("code").textContent = key;
}

// -- watching a job -----------------------------------------------------------------------------

function watch(state) {
  const jobId = state.job.job_id;
  const lastSeq = storedSeq(jobId);
  if (lastSeq > 0) {
    state.shownSeq = lastSeq;
    logLine(state, `resumed after #${lastSeq}: the events before it were shown before the page was reloaded`, "resumed");
  }
  state.card.querySelector(".connection").hidden = false;
  const url = new URL(state.job.ws_url, window.location.href);
  url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
  url.host = window.location.host; // the page's own origin: cookies and origin checks match
  state.stream = JobStream.watch(url.href, {
    lastSeq,
    onEvent: (frame) => onEvent(state, frame),
    // The client drops a repeat (seq <= the last one); the page still shows it, never hides it.
    onDropped: (frame) => {
      logLine(state, `#${frame.seq} ${frame.stage} ${JSON.stringify(frame.data)}`, "duplicate").dataset.seq = frame.seq;
    },
    onReset: (snapshot) => onReset(state, snapshot),
    onError: (error) => logLine(state, `error ${error.code}: ${error.detail}`, "reset"),
    onStatus: (status, info) => showConnection(state, status, info),
  });
  expectQuiet(state);
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
  if (status === "closed") clearTimeout(state.quietTimer);
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

function setBar(state, percent) {
  // A job that ended without completing has a full bar: it is over. It says how it ended, in
  // its colour too (app.css), and its chips say where it stopped. A completed job's bar follows
  // its events, whose final one says 100: events backfilled after the page learned that the job
  // completed (a reconnect, the list's poll) each still show their own progress.
  const ended = ENDED.includes(state.jobState) && state.jobState !== "COMPLETED";
  const value = ended ? 100 : percent;
  const text = ended ? STATE_WORDS[state.jobState] : `${Math.round(value)} %`;
  state.progress = value;
  const bar = state.card.querySelector("progress");
  bar.value = value;
  bar.setAttribute("aria-valuenow", String(value));
  bar.setAttribute("aria-valuetext", text);
  state.card.querySelector(".percent").textContent = text;
}

function endBar(state, jobState) {
  state.card.querySelector(".bar").classList.add("ended", jobState.toLowerCase().replace("_", "-"));
  // A completed job's own final event fills its bar (setBar).
  if (jobState !== "COMPLETED") setBar(state, 100);
}

function showProgress(state, stage, data) {
  const final = Boolean(data && data.final);
  const outcome = final ? String(data.state || "COMPLETED") : null;
  if (!final) {
    // The event's stage runs (a retry that was waiting started, if any); those before it are done.
    if (!state.chips.has(stage)) addChip(state, stage);
    const order = stageOrder(state);
    const index = order.indexOf(stage);
    order.forEach((name, chipIndex) => {
      const chip = state.chips.get(name);
      if (chipIndex < index && chip.dataset.state !== "COMPLETED") setChip(chip, "COMPLETED", "");
      if (chipIndex === index && chip.dataset.state !== "RUNNING") setChip(chip, "RUNNING", "");
      if (chipIndex <= index) clearFailure(state, name); // past, or its next attempt runs
    });
  } else if (outcome === "FAILED" || outcome === "CANCELLED") {
    // Where it stopped: the failed stage (the final event says which), or the running one.
    const where = outcome === "FAILED" && data.error && data.error.stage ? data.error.stage : null;
    for (const [name, chip] of state.chips) {
      if (name === where || (!where && chip.dataset.state === "RUNNING")) setChip(chip, outcome, STATE_WORDS[outcome]);
    }
  }
  // The event says how far the job is; the page does not guess it from the stage, which put
  // scan a stage behind and kept chat at 0 % through its whole answer. An event without a
  // progress leaves the bar where it was. The final event of a job that did not complete
  // leaves it to the job's state (endBar: full, in the outcome's colour).
  const reported = data ? data.progress : undefined;
  if (final && outcome !== "COMPLETED") return;
  if (typeof reported === "number" && Number.isFinite(reported)) {
    setBar(state, Math.min(100, Math.max(0, reported)));
  } else if (final) {
    setBar(state, 100);
  }
}

function showAnswer(state, stage, text, gap) {
  // An event's `text`: a stage's texts, concatenated in seq order, are one text (chat's answer
  // chunks are its answer: it grows as they arrive); each stage's text is a line of its own
  // (a refund's "holding for 0 s", then its payment's "calling the bank").
  if (typeof text !== "string") return;
  const answer = state.card.querySelector(".answer");
  answer.hidden = false;
  const name = String(stage || "");
  let part = answer.querySelector(`.answer-part[data-stage="${CSS.escape(name)}"]`);
  if (!part) {
    part = document.createElement("div");
    part.className = "answer-part";
    part.dataset.stage = name;
    answer.append(part);
  }
  part.textContent += (gap ? " […] " : "") + text;
}

function onEvent(state, frame) {
  const line = logLine(state, `#${frame.seq} ${frame.stage} ${JSON.stringify(frame.data)}`, "");
  line.dataset.seq = frame.seq;
  state.shownSeq = Math.max(state.shownSeq, frame.seq);
  storeSeq(state.job.job_id, frame.seq);
  showProgress(state, frame.stage, frame.data);
  showAnswer(state, frame.stage, (frame.data || {}).text, false);
  const data = frame.data || {};
  if (data.final === true) {
    const outcome = String(data.state || "COMPLETED");
    if (data.error && typeof data.error === "object") showFailure(state, null, data.error);
    setJobState(state, outcome);
    refreshDetail(state); // each stage's attempts, and the error that stopped it
    return;
  }
  setJobState(state, "RUNNING");
  state.quietDelay = QUIET_FIRST_MS;
  expectQuiet(state);
}

function onReset(state, snapshot) {
  logLine(state, `reset (recovered: false): state ${JSON.stringify(snapshot)}`, "reset");
  const seq = Number(snapshot.seq) || 0;
  state.shownSeq = Math.max(state.shownSeq, seq);
  storeSeq(state.job.job_id, seq);
  if (snapshot.stage) showProgress(state, snapshot.stage, snapshot.data);
  // The chunks between the last one shown and the snapshot's are gone: the answer says so.
  showAnswer(state, snapshot.stage, (snapshot.data || {}).text, true);
  if (ENDED.includes(snapshot.state)) setJobState(state, snapshot.state);
  refreshDetail(state);
}

// -- a job's detail: its stages' states, attempts and errors --------------------------------------

function expectQuiet(state) {
  clearTimeout(state.quietTimer);
  // Only a running job waits for a retry; a pending one's next news is its first event. A
  // waiting one may resume, and wait again, without an event (a sleep, a signal sent elsewhere).
  if (state.jobState !== "RUNNING" && state.jobState !== "WAITING") return;
  state.quietTimer = setTimeout(async () => {
    const answer = await refreshDetail(state);
    state.quietDelay = Math.min(QUIET_MAX_MS, state.quietDelay * 2);
    if (answer && answer.status === 429) state.quietDelay = Math.max(state.quietDelay, answer.retryAfter * 1000);
    expectQuiet(state);
  }, state.quietDelay);
}

async function refreshDetail(state) {
  if (state.detailAsked) return null;
  state.detailAsked = true;
  const answer = await callApi(`/api/jobs/${encodeURIComponent(state.job.job_id)}/`);
  state.detailAsked = false;
  if (answer.ok && answer.body) showDetail(state, answer.body);
  return answer;
}

function showDetail(state, detail) {
  const latest = detail.latest_event && typeof detail.latest_event === "object" ? detail.latest_event : null;
  const seq = latest ? Number(latest.seq) || 0 : 0;
  const ended = ENDED.includes(detail.state);
  // A live job's detail older than the events shown would undo them: the stream is newer.
  if (!ended && seq < state.shownSeq) return;
  showChain(state, detail);
  if (latest && latest.data && seq >= state.shownSeq) {
    state.shownSeq = Math.max(state.shownSeq, seq);
    showProgress(state, String(latest.stage || ""), latest.data);
  }
  for (const stage of Array.isArray(detail.stages) ? detail.stages : []) showStage(state, stage, detail.state);
  if (detail.error && typeof detail.error === "object") showFailure(state, null, detail.error);
  // Absent (an older server): no wait to tell, no signal to offer.
  state.waitingFor = typeof detail.waiting_for === "string" ? detail.waiting_for : null;
  state.runAfter = typeof detail.run_after === "string" ? detail.run_after : null;
  state.signals = Array.isArray(detail.signals) ? detail.signals.map(String) : [];
  showFamily(state, detail);
  setJobState(state, detail.state);
  showWait(state);
}

function showStage(state, stage, jobState) {
  const name = String(stage.name);
  const chip = state.chips.get(name) || addChip(state, name);
  if (stage.label) chip.title = String(stage.label);
  const attempts = Number(stage.attempts) || 0;
  const error = stage.error && typeof stage.error === "object" ? stage.error : null;
  switch (stage.state) {
    case "COMPLETED":
      setChip(chip, "COMPLETED", attempts > 1 ? `${attempts} attempts` : "");
      break;
    case "RUNNING":
      setChip(chip, "RUNNING", attempts > 1 ? `attempt ${attempts}` : "");
      break;
    case "RETRYING":
      // Attempt n failed; attempt n + 1 waits for its backoff.
      setChip(chip, "RETRYING", `retrying: attempt ${attempts + 1}`);
      break;
    case "CANCELLED":
      setChip(chip, "CANCELLED", "cancelled");
      break;
    case "WAITING":
      setChip(chip, "WAITING", waitWords(stage.waiting_for));
      break;
    case "FAILED":
      // An older server says FAILED (error JobCancelled) of the stage a cancel stopped.
      if (jobState === "CANCELLED") setChip(chip, "CANCELLED", "cancelled");
      else setChip(chip, "FAILED", attempts > 1 ? `failed after ${attempts} attempts` : "failed");
      break;
    default:
      setChip(chip, "PENDING", "");
  }
  if (stage.state === "RETRYING" && error) showFailure(state, name, error, `attempt ${attempts} failed, attempt ${attempts + 1} waits`);
  else if (stage.state === "FAILED" && error && jobState !== "CANCELLED") showFailure(state, name, error);
  else clearFailure(state, name);
}

// One line per stage (or the job) that failed: what its error said, as text.
function showFailure(state, stage, error, context) {
  const notes = state.card.querySelector(".stage-notes");
  const where = stage || error.stage || "";
  let line = notes.querySelector(`li[data-stage="${CSS.escape(where)}"]`);
  if (!line) {
    line = document.createElement("li");
    line.dataset.stage = where;
    notes.append(line);
  }
  const type = error.type ? `${error.type}: ` : "";
  const prefix = where ? `${where}${context ? ` (${context})` : " failed"}: ` : "The job failed: ";
  line.className = context ? "retrying" : "failed";
  line.textContent = `${prefix}${type}${error.message || ""}`;
}

function clearFailure(state, stage) {
  const line = state.card.querySelector(`.stage-notes li[data-stage="${CSS.escape(stage)}"]`);
  if (line) line.remove();
}

// -- waits, signals, parent and children ----------------------------------------------------------

// The signals a wait is for: "signal:approve,reject" -> ["approve", "reject"]; [] for another wait.
function awaitedSignals(waitingFor) {
  if (typeof waitingFor !== "string" || !waitingFor.startsWith("signal:")) return [];
  return waitingFor.slice("signal:".length).split(",").filter(Boolean);
}

// A stage's wait, in words: its chip's note and the card's wait line.
function waitWords(waitingFor) {
  const signals = awaitedSignals(waitingFor);
  if (signals.length) return `waiting for ${signals.join(" or ")}`;
  if (waitingFor === "sleep") return "sleeping";
  if (waitingFor === "children") return "waiting for its children";
  return "waiting";
}

function when(iso) {
  const moment = new Date(iso);
  return Number.isNaN(moment.getTime()) ? String(iso) : moment.toLocaleString();
}

// The card's wait line (what a WAITING job waits for, until when; when a delayed job starts) and
// its signal buttons: one per signal its waiting stage awaits, among those its type declares.
function showWait(state) {
  const line = state.card.querySelector(".wait");
  const group = state.card.querySelector(".signals");
  const waiting = state.jobState === "WAITING";
  let text = "";
  if (waiting) {
    text = waitWords(state.waitingFor);
    text = text.charAt(0).toUpperCase() + text.slice(1);
    // A sleep's end, a signal's timeout (past it the stage fails), or when it resumes anyway.
    if (state.runAfter) {
      const bounded = state.waitingFor === "sleep" || awaitedSignals(state.waitingFor).length > 0;
      text += bounded ? ` until ${when(state.runAfter)}` : `; resumes at ${when(state.runAfter)} at the latest`;
    }
    text += ".";
  } else if (state.jobState === "PENDING" && state.runAfter && new Date(state.runAfter) > new Date()) {
    text = `Starts at ${when(state.runAfter)}.`;
  }
  line.hidden = !text;
  line.textContent = text;
  const declared = state.signals;
  const offered = waiting && state.signalledFor !== state.waitingFor
    ? awaitedSignals(state.waitingFor).filter((name) => declared.length === 0 || declared.includes(name))
    : [];
  const shown = [...group.querySelectorAll("button")].map((button) => button.dataset.signal);
  if (shown.join(",") !== offered.join(",")) {
    group.replaceChildren(
      ...offered.map((name) => {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "signal";
        button.dataset.signal = name;
        button.textContent = name;
        button.setAttribute("aria-label", `Send the signal ${name} to the ${state.job.domain} job ${shortId(state.job.job_id)}`);
        button.addEventListener("click", () => sendSignal(state, name));
        return button;
      }),
    );
  }
  group.hidden = offered.length === 0;
}

// The job that started this one, and the jobs its stages started (each a link to its card, which
// the list brings: they are the same user's jobs), with their states.
function showFamily(state, detail) {
  const family = state.card.querySelector(".family");
  const parts = [];
  if (detail.parent) parts.push(["Started by ", jobLink(String(detail.parent))]);
  const children = Array.isArray(detail.children) ? detail.children : [];
  if (children.length) {
    const links = [`${children.length} ${children.length === 1 ? "child" : "children"}: `];
    children.slice(0, SHOWN_CHILDREN).forEach((child, index) => {
      if (index) links.push(", ");
      links.push(jobLink(String(child.job_id)), ` (${STATE_WORDS[child.state] || String(child.state).toLowerCase()})`);
    });
    if (children.length > SHOWN_CHILDREN) links.push(` and ${children.length - SHOWN_CHILDREN} more`);
    parts.push(links);
  }
  family.hidden = parts.length === 0;
  family.replaceChildren(...parts.flatMap((part, index) => (index ? [" · ", ...part] : part)));
}

async function sendSignal(state, name) {
  const buttons = [...state.card.querySelectorAll(".signals button")];
  for (const each of buttons) each.disabled = true;
  showProblem(state, "");
  // A new key per press; the same one again when the last press got no answer (it may have sent
  // the signal: the server then answers with that one).
  state.signalKeys[name] = state.signalKeys[name] || crypto.randomUUID();
  showActionKey(state, state.signalKeys[name], `Signal ${name}`);
  const answer = await callApi(
    `/api/jobs/${encodeURIComponent(state.job.job_id)}/signals/${encodeURIComponent(name)}/`,
    { method: "POST", key: state.signalKeys[name], body: "{}" },
  );
  for (const each of buttons) each.disabled = false;
  if (answer.status === 0 || answer.status >= 500) {
    showProblem(state, `Signal ${name}: ${answer.problem}. Press ${name} again: the same Idempotency-Key is sent.`);
    return;
  }
  state.signalKeys[name] = null;
  if (answer.ok) {
    // The job wakes and runs on: its events come over its stream. No second signal for this wait.
    state.signalledFor = state.waitingFor;
    showWait(state);
    announce(`${state.job.domain} job ${shortId(state.job.job_id)}: signal ${name} sent`);
    state.quietDelay = QUIET_FIRST_MS;
    expectQuiet(state);
    return;
  }
  showProblem(state, `Signal ${name} refused: ${answer.problem}`);
  if (answer.status === 409) refreshDetail(state); // sent already, or the job ended: show how it stands
}

// -- cancel and retry ---------------------------------------------------------------------------

async function cancelJob(state) {
  const button = state.card.querySelector(".cancel");
  button.disabled = true;
  showProblem(state, "");
  const answer = await callApi(`/api/jobs/${encodeURIComponent(state.job.job_id)}/cancel/`, { method: "POST" });
  if (answer.ok) {
    // A pending job is cancelled at once; a running one when its run next looks (its final
    // event comes over the stream).
    state.cancelling = true;
    setJobState(state, (answer.body && answer.body.state) || state.jobState);
    if (LIVE.includes(state.jobState)) {
      state.card.querySelector(".job-state").textContent = "cancelling…";
      announce(`${state.job.domain} job ${shortId(state.job.job_id)}: cancel requested`);
    }
    return;
  }
  showProblem(state, `Cancel refused: ${answer.problem}`);
  button.disabled = false;
  if (answer.status === 409) refreshDetail(state); // it ended meanwhile: show how
}

async function retryJob(state) {
  const button = state.card.querySelector(".retry");
  button.disabled = true;
  showProblem(state, "");
  // A new key per retry; the same one again when the last press got no answer (it may have
  // made the retry: the server then answers with that one, not a second).
  state.retryKey = state.retryKey || crypto.randomUUID();
  showActionKey(state, state.retryKey);
  const answer = await callApi(`/api/jobs/${encodeURIComponent(state.job.job_id)}/retry/`, {
    method: "POST",
    key: state.retryKey,
  });
  button.disabled = false;
  if (answer.status === 0 || answer.status >= 500) {
    showProblem(state, `Retry: ${answer.problem}. Press Retry again: the same Idempotency-Key is sent.`);
    return;
  }
  state.retryKey = null;
  const retriedBy = answer.status === 409 && answer.body && answer.body.retried_by;
  if (retriedBy) {
    // Retried elsewhere already (another tab, the API, the admin): a job has one retry. The
    // card points at it, and the list brings its card.
    showRetriedAs(state, String(retriedBy));
    announce(`${state.job.domain} job ${shortId(state.job.job_id)} was retried already, as ${shortId(retriedBy)}`);
    pollSoon();
    return;
  }
  if (answer.status !== 201 || !answer.body) {
    showProblem(state, `Retry refused: ${answer.problem}`);
    if (answer.status === 409) refreshDetail(state);
    return;
  }
  const job = answer.body;
  const shown = watched.get(String(job.job_id));
  if (shown) {
    // A replay of this key, or the list brought the new job first.
    showRetryOf(shown, String(state.job.job_id));
    pointAt(shown);
  } else {
    const retry = addCard(Object.assign({ retry_of: state.job.job_id }, job), { after: null });
    watch(retry);
    announce(`${state.job.domain} job ${shortId(state.job.job_id)} retried as ${shortId(job.job_id)}`);
  }
}

// -- the user's recent jobs ---------------------------------------------------------------------

// Jobs started elsewhere (the API, the project's code, another tab) and retries made elsewhere
// reach an open page by polling: every POLL_MS the page asks for the newest page of its list
// (GET /api/jobs/?page_size=10) and adds the jobs it does not show, in their place, and each
// listed card's `retried_by`. Polling rather than a per-user live channel: that channel would
// need every start, by any process, published to a per-user Redis channel and a second socket
// per tab, a new protocol to keep; the list is there already, and one of its pages is cheap:
// six small queries (the session, the user and their permissions, the count and the page, both
// on the (owner, accepted_at) index), about 4.5 ms of the server's time in all on SQLite, 2.6 kB
// (docs/reference/page.md). The page polls only while it is visible (a hidden tab asks nothing,
// and asks at once when shown again), waits as long as a 429's Retry-After says, and backs off
// on failures: one visible tab spends 30 of the jobs throttle's 120 requests a minute. A live
// card's state is left to its stream, which is in seq order; the list only adds cards and
// retry chains.
const POLL_MS = 2000;
const POLL_MAX_MS = 60000;
// Pages walked at most in one poll, when none of the newest page's jobs was on the page yet.
const POLL_MAX_PAGES = 5;

const moreButton = document.getElementById("more-jobs");
const jobsStatus = document.getElementById("jobs-status");
let listTotal = null; // the user's jobs, as the list last said (null: it has not answered yet)
let pollTimer = null;
let pollDelay = POLL_MS;
let polling = false;
let pollAgain = false; // asked for while a poll was under way: its answer may predate the news

function isPage(answer) {
  return answer.ok && answer.body && Array.isArray(answer.body.results);
}

// A listed job: its card, added if the page does not show it (after `newer`, the job listed
// just before it, or last), and what the list says of its retries.
function listJob(job, newer) {
  const shown = watched.get(String(job.job_id));
  if (shown) {
    showChain(shown, job);
    return shown;
  }
  const state = addCard(job, { after: newer });
  if (LIVE.includes(state.jobState)) watch(state);
  refreshDetail(state); // its stages
  return state;
}

// The newest jobs: the first page, and the next ones while none of a page's jobs was on the
// page before (more jobs started since the last poll than a page holds).
async function loadNewest() {
  const hadCards = watched.size > 0;
  let url = `/api/jobs/?page_size=${LIST_PAGE_SIZE}`;
  let newer = null;
  let answer = null;
  for (let pages = 0; pages < POLL_MAX_PAGES && url; pages += 1) {
    answer = await callApi(url);
    if (!isPage(answer)) break;
    listTotal = Number(answer.body.count) || 0;
    let reached = false;
    for (const job of answer.body.results) {
      reached = reached || watched.has(String(job.job_id));
      const state = listJob(job, newer);
      newer = state;
    }
    // The next page's address as a path of this origin (DRF writes it absolute, with the host
    // the request named).
    url = hadCards && !reached && answer.body.next ? pathOf(answer.body.next) : null;
  }
  showJobsStatus();
  return answer;
}

// Older jobs: the page of the list after the cards shown (all of the newest ones, the list
// being newest first). A page the new jobs shifted repeats some of them: those are skipped.
async function loadOlder() {
  moreButton.disabled = true;
  const page = Math.floor(watched.size / LIST_PAGE_SIZE) + 1;
  const answer = await callApi(`/api/jobs/?page_size=${LIST_PAGE_SIZE}&page=${page}`);
  moreButton.disabled = false;
  if (!isPage(answer)) {
    jobsStatus.textContent = `Older jobs could not be listed: ${answer.problem || "not a page of jobs"}`;
    return;
  }
  listTotal = Number(answer.body.count) || 0;
  for (const job of answer.body.results) if (!watched.has(String(job.job_id))) listJob(job, "end");
  showJobsStatus();
}

function showJobsStatus() {
  if (listTotal === null) return; // the list has not answered yet
  // The cards on the page are the newest jobs; one started here since the last answer counts
  // among them until the next one.
  const total = Math.max(listTotal, watched.size);
  moreButton.hidden = watched.size >= total;
  if (watched.size === 0) jobsStatus.textContent = "No jobs yet: start one above.";
  else jobsStatus.textContent = `Newest first: ${watched.size} of ${total} listed.`;
}

function pathOf(address) {
  const url = new URL(address, window.location.href);
  return url.pathname + url.search;
}

async function poll() {
  pollTimer = null;
  if (polling || document.hidden) return;
  polling = true;
  pollAgain = false;
  const first = listTotal === null;
  const answer = await loadNewest();
  polling = false;
  if (first && !isPage(answer)) {
    jobsStatus.textContent = `Your jobs could not be listed: ${answer.problem || "not a page of jobs"}`;
  }
  if (isPage(answer)) pollDelay = POLL_MS;
  else if (answer.status === 429 && answer.retryAfter) pollDelay = Math.max(POLL_MS, answer.retryAfter * 1000);
  else pollDelay = Math.min(POLL_MAX_MS, pollDelay * 2);
  schedulePoll(pollAgain && isPage(answer) ? 0 : pollDelay);
}

function schedulePoll(delay) {
  clearTimeout(pollTimer);
  pollTimer = null;
  if (!document.hidden) pollTimer = setTimeout(poll, delay);
}

// Something changed that the list will show (a retry made elsewhere): ask now.
function pollSoon() {
  if (polling) pollAgain = true;
  else schedulePoll(0);
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden) {
    pollSoon();
    return;
  }
  clearTimeout(pollTimer); // nothing is asked while hidden
  pollTimer = null;
});

moreButton.addEventListener("click", loadOlder);

poll();

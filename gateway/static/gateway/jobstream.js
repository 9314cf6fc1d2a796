/* jobstream.js: a small client for the job stream, ws://HOST/ws/jobs/<job_id>/?last_seq=N.
 * No dependencies; a plain script that defines one global, `JobStream`.
 *
 *   <script src="{% static 'gateway/jobstream.js' %}"></script>
 *   <script>
 *     const stream = JobStream.watch(job.ws_url, {   // from POST /api/jobs/ (or a path)
 *       lastSeq: 0,                                  // the last seq your app already has
 *       onEvent(event) { console.log(event.seq, event.stage, event.data); },
 *       onReset(state) { console.log("history gone; the job is now", state); },
 *       onStatus(status, info) { badge.textContent = status; },
 *       onError(error) { console.warn(error.code, error.detail); },
 *     });
 *     // stream.lastSeq: the last seq delivered; stream.status; stream.close() to stop.
 *   </script>
 *
 * - Connects with ?last_seq=<lastSeq> and, after every disconnect, resumes from the last seq
 *   delivered. onEvent(event) gets each event once, in seq order: a frame with seq <= lastSeq
 *   is dropped (the server never sends one; onDropped(frame) hears of it if you ask).
 * - onReset(state, frame): the history no longer reaches back; carry on from `state` (its seq
 *   becomes lastSeq). A state whose `state` is COMPLETED/FAILED/TIMED_OUT/CANCELLED is the job's outcome.
 * - Reconnects on any other close with exponential backoff and jitter (minDelay 500 ms doubling
 *   to maxDelay 10 s, back to the start once a socket opens); at once after 4008 (too slow).
 * - Stops for good on 4400/4401/4403/4404, after calling onError({code, detail, fatal: true});
 *   an error frame that does not end the stream (4008) gives onError({..., fatal: false}).
 * - Stops once the job's final event (data.final === true) or its outcome was delivered.
 * - onStatus(status, info): "connecting", "open", "reconnecting" ({attempt, delay, code}),
 *   "closed" ({finished} | {code, error} | {byApp}); called again on every new attempt.
 */
(function (root) {
  "use strict";

  const FATAL = { 4400: "bad parameters", 4401: "not logged in", 4403: "not your job", 4404: "no such job" };
  const ENDED = ["COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED"];

  class JobStream {
    static watch(url, options) {
      return new JobStream(url, options);
    }

    constructor(url, options = {}) {
      this.url = url;
      this.options = options;
      this.lastSeq = Math.max(0, Math.floor(Number(options.lastSeq) || 0));
      this.minDelay = options.minDelay ?? 500;
      this.maxDelay = options.maxDelay ?? 10000;
      this.status = null;
      this.attempts = 0; // failed connections since a socket last opened
      this.stopped = false;
      this.socket = null;
      this.timer = null;
      this.connect("connecting");
    }

    close() {
      this.stop({ byApp: true });
    }

    // Internals.

    call(name, ...args) {
      const callback = this.options[name];
      if (typeof callback !== "function") return;
      try {
        callback.apply(this, args);
      } catch (error) {
        setTimeout(() => { throw error; }); // the app's bug: reported, the stream goes on
      }
    }

    setStatus(status, info = {}) {
      this.status = status;
      this.call("onStatus", status, info);
    }

    socketUrl() {
      const url = new URL(this.url, root.location ? root.location.href : undefined);
      if (url.protocol === "http:") url.protocol = "ws:";
      else if (url.protocol === "https:") url.protocol = "wss:";
      url.searchParams.set("last_seq", String(this.lastSeq));
      return url.toString();
    }

    connect(status) {
      this.timer = null;
      this.fatal = null;
      const socket = new WebSocket(this.socketUrl());
      this.socket = socket;
      this.setStatus(status, { attempt: this.attempts });
      socket.onopen = () => {
        if (socket !== this.socket) return;
        this.attempts = 0;
        this.setStatus("open");
      };
      socket.onmessage = (message) => {
        if (socket !== this.socket || this.stopped) return;
        let frame;
        try {
          frame = JSON.parse(message.data);
        } catch (error) {
          return; // not a frame of the protocol
        }
        this.onFrame(frame);
      };
      socket.onclose = (event) => {
        if (socket !== this.socket || this.stopped) return;
        this.socket = null;
        const code = this.fatal ? this.fatal.code : event.code;
        if (FATAL[code]) {
          if (!this.fatal) this.call("onError", { code, detail: event.reason || FATAL[code], fatal: true });
          this.stop({ code, error: FATAL[code] });
          return;
        }
        // Anything else (server restart, network, 1011, 4008): resume from lastSeq.
        let delay = 0;
        if (code !== 4008) {
          const ceiling = Math.min(this.maxDelay, this.minDelay * 2 ** this.attempts);
          delay = Math.round(ceiling / 2 + (Math.random() * ceiling) / 2);
          this.attempts += 1;
        }
        this.setStatus("reconnecting", { attempt: this.attempts, delay, code });
        this.timer = setTimeout(() => this.connect("reconnecting"), delay);
      };
    }

    onFrame(frame) {
      if (frame.type === "event") {
        if (!(frame.seq > this.lastSeq)) {
          this.call("onDropped", frame);
          return;
        }
        this.lastSeq = frame.seq;
        this.call("onEvent", frame);
        if (frame.data && frame.data.final === true) this.stop({ finished: true });
      } else if (frame.type === "reset") {
        const state = frame.state || {};
        this.lastSeq = Math.max(this.lastSeq, Number(state.seq) || 0);
        this.call("onReset", state, frame);
        if ((state.data && state.data.final === true) || ENDED.includes(state.state)) this.stop({ finished: true });
      } else if (frame.type === "error") {
        const fatal = Boolean(FATAL[frame.code]);
        if (fatal) this.fatal = { code: frame.code }; // the close that follows ends the stream
        this.call("onError", { code: frame.code, detail: frame.detail, fatal });
      }
    }

    stop(info) {
      if (this.stopped) return;
      this.stopped = true;
      clearTimeout(this.timer);
      if (this.socket) this.socket.close(1000);
      this.socket = null;
      this.setStatus("closed", info);
    }
  }

  root.JobStream = JobStream;
  if (typeof module === "object" && module.exports) module.exports = JobStream;
})(typeof globalThis !== "undefined" ? globalThis : this);

// Following a job's logs: NDJSON lines with a cursor each; after a dropped connection the
// follower asks for the lines after the last cursor it has, so none is lost or repeated.
import { problemOf, signIn } from "./api.js";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class LogFollower {
  // `filter` is "" (all), "role=trainer" or "worker=trainer-0"; `tail` lines per worker
  // on the first connection; `owner` names another user's job (administrators);
  // `onLines(entries)`, `onStatus(state, detail)`.
  constructor({ job, owner = null, filter = "", tail = 0, onLines, onStatus }) {
    this.job = job;
    this.owner = owner;
    this.filter = filter;
    this.tail = tail;
    this.onLines = onLines;
    this.onStatus = onStatus;
    this.cursor = null;
    this.controller = new AbortController();
    this.stopped = false;
  }

  url() {
    const query = new URLSearchParams(this.filter);
    if (this.owner) query.set("user", this.owner);
    query.set("follow", "1");
    if (this.cursor) query.set("cursor", this.cursor);
    else if (this.tail) query.set("tail", String(this.tail));
    return `/api/v1/jobs/${encodeURIComponent(this.job)}/logs?${query}`;
  }

  stop() {
    this.stopped = true;
    this.controller.abort();
  }

  async run() {
    let delay = 500;
    while (!this.stopped) {
      try {
        const response = await fetch(this.url(), {
          headers: { Accept: "application/x-ndjson" },
          credentials: "same-origin",
          cache: "no-store",
          signal: this.controller.signal,
        });
        if (response.status === 401) return signIn();
        if (!response.ok) {
          const problem = await problemOf(response);
          this.onStatus("failed", problem.detail || problem.title);
          if (response.status < 500) return;
          throw new Error(problem.title);
        }
        this.onStatus("following");
        await this.read(response.body);
        // A clean end: the job is final and every line was sent (a cut connection
        // would have thrown instead).
        this.onStatus("ended");
        return;
      } catch (error) {
        if (this.stopped) return;
        this.onStatus("reconnecting", error.message);
        await sleep(delay);
        delay = Math.min(delay * 2, 10000);
      }
    }
  }

  async read(stream) {
    const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
    let pending = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      pending += value;
      const lines = pending.split("\n");
      pending = lines.pop();
      const entries = [];
      for (const line of lines) {
        if (!line) continue;
        entries.push(JSON.parse(line));
      }
      if (entries.length) {
        // The cursor moves only with lines actually handed on: a resume starts after them.
        this.onLines(entries);
        this.cursor = entries[entries.length - 1].cursor;
      }
    }
  }
}

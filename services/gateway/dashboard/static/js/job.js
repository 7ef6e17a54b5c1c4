// One job: its state and why, its workers, events and spec, live logs, and kill. With
// `?user=NAME` in the page's address, an administrator sees that user's job.
import { ApiError, api } from "./api.js";
import { JobCharts } from "./charts.js";
import { LogFollower } from "./logs.js";
import { $, FINAL_STATES, ask, every, h, stateBadge, when } from "./ui.js";

const REFRESH_MS = 2000;
const FIRST_TAIL = 5000; // lines per worker shown when the page opens
const MAX_LINES = 20000; // kept in the page; older ones are dropped (Download has all)

function workerRow(w) {
  return h(
    "tr",
    { dataset: { worker: w.name, state: w.state } },
    h("td", {}, w.name),
    h("td", {}, w.role),
    h("td", { class: "num" }, w.index),
    h("td", {}, stateBadge(w.state)),
    h("td", { class: "num" }, w.restarts),
    h("td", {}, w.host || ""),
    h("td", { class: "num" }, w.exit_code ?? ""),
  );
}

function eventRow(e) {
  return h(
    "tr",
    {},
    h("td", { title: e.time }, when(e.time)),
    h("td", {}, e.state ? stateBadge(e.state) : e.type),
    h("td", {}, e.reason || ""),
    h("td", {}, e.message || ""),
  );
}

function specList(spec) {
  const items = [];
  for (const [key, value] of Object.entries(spec)) {
    if (value === null || value === undefined || value === "") continue;
    const text = typeof value === "object" ? JSON.stringify(value) : String(value);
    items.push(h("dt", {}, key), h("dd", {}, text));
  }
  return items;
}

class LogView {
  constructor(job, owner) {
    this.job = job;
    this.owner = owner;
    this.lines = $("log-lines");
    this.search = $("log-search");
    this.select = $("log-worker");
    this.status = $("log-status");
    this.download = $("log-download");
    this.follower = null;
    this.workers = new Set();
    this.search.addEventListener("input", () => this.applySearch());
    this.select.addEventListener("change", () => this.follow());
  }

  addWorkers(names) {
    for (const name of names) {
      if (this.workers.has(name)) continue;
      this.workers.add(name);
      this.select.append(h("option", { value: `worker=${name}` }, name));
    }
  }

  follow() {
    this.follower?.stop();
    this.lines.replaceChildren();
    const filter = this.select.value;
    const download = new URLSearchParams(filter);
    if (this.owner) download.set("user", this.owner);
    this.download.href = `/api/v1/jobs/${encodeURIComponent(this.job)}/logs?${download}`;
    this.download.download = `${this.job}${filter ? `-${filter.split("=")[1]}` : ""}.log`;
    this.follower = new LogFollower({
      job: this.job,
      owner: this.owner,
      filter,
      tail: FIRST_TAIL,
      onLines: (entries) => this.append(entries),
      onStatus: (state, detail) => this.setStatus(state, detail),
    });
    this.follower.run();
  }

  append(entries) {
    const needle = this.search.value.toLowerCase();
    const stick = this.lines.scrollTop + this.lines.clientHeight >= this.lines.scrollHeight - 8;
    const fragment = document.createDocumentFragment();
    for (const entry of entries) {
      const line = h("span", { class: "line", dataset: { worker: entry.worker } });
      line.append(h("span", { class: "worker" }, `[${entry.worker}] `), entry.line);
      if (needle && !entry.line.toLowerCase().includes(needle)) line.hidden = true;
      fragment.append(line);
    }
    this.lines.append(fragment);
    while (this.lines.childElementCount > MAX_LINES) this.lines.firstElementChild.remove();
    if (needle) this.countMatches();
    if (stick) this.lines.scrollTop = this.lines.scrollHeight;
  }

  applySearch() {
    const needle = this.search.value.toLowerCase();
    for (const line of this.lines.children) {
      line.hidden = needle !== "" && !line.lastChild.textContent.toLowerCase().includes(needle);
    }
    this.countMatches();
  }

  countMatches() {
    const needle = this.search.value;
    if (!needle) {
      $("log-matches").textContent = "";
      return;
    }
    let count = 0;
    for (const line of this.lines.children) if (!line.hidden) count += 1;
    $("log-matches").textContent = `${count} matching line${count === 1 ? "" : "s"}`;
  }

  setStatus(state, detail) {
    const words = {
      following: "following",
      reconnecting: "connection lost; reconnecting…",
      ended: "end of the logs: the job has finished",
      failed: `cannot read the logs: ${detail}`,
    };
    this.status.textContent = words[state] || state;
    this.status.dataset.state = state;
  }
}

export function start(data) {
  const name = data.job;
  const owner = new URLSearchParams(location.search).get("user");
  const theirs = owner && owner !== data.user ? owner : null;
  // The job's API address, with whose it is when it is another user's.
  const jobUrl = (extra = {}, sub = "") => {
    const query = new URLSearchParams(extra);
    if (theirs) query.set("user", theirs);
    const text = query.toString();
    return `/api/v1/jobs/${encodeURIComponent(name)}${sub ? `/${sub}` : ""}${text ? `?${text}` : ""}`;
  };
  // TensorBoard and VisualDL serve a job's files to its owner alone (docs/metrics.md §4).
  if (theirs) $("job-boards").hidden = true;
  if (theirs) $("job-name").textContent = `${theirs}/${name}`;
  const logs = new LogView(name, theirs);
  const charts = new JobCharts({ url: (sub) => jobUrl({}, sub), isFinal: () => final });
  let stopRefresh = () => {};
  let seen = false;
  let final = false;

  function render(job) {
    $("job").hidden = false;
    $("job-state").replaceWith(Object.assign(stateBadge(job.state), { id: "job-state" }));
    document.body.dataset.state = job.state;
    final = FINAL_STATES.has(job.state);
    const reason = $("job-reason");
    reason.textContent = job.reason || "";
    reason.className = `reason reason-${job.state.toLowerCase()}`;
    $("job-kill").hidden = final;
    $("job-remove").textContent = final ? "Remove" : "Kill and remove";
    $("job-workers").replaceChildren(...(job.workers || []).map(workerRow));
    // The events' box scrolls: it keeps showing the newest unless the reader scrolled up.
    const events = $("job-events").closest(".table-wrap");
    const stick = events.scrollTop + events.clientHeight >= events.scrollHeight - 8;
    $("job-events").replaceChildren(...(job.events || []).map(eventRow));
    if (stick) events.scrollTop = events.scrollHeight;
    $("job-spec").replaceChildren(...specList(job.spec || {}));
    logs.addWorkers((job.workers || []).map((w) => w.name));
  }

  function missing(message) {
    logs.follower?.stop();
    charts.stop();
    $("job").hidden = true;
    const notice = $("job-missing");
    notice.hidden = false;
    notice.textContent = message;
  }

  async function refresh() {
    try {
      const job = await api(jobUrl());
      render(job);
      if (!seen) {
        seen = true;
        logs.follow();
        charts.start();
      }
      return !final;
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        missing(theirs ? `${theirs} has no job named “${name}”.` : `You have no job named “${name}”.`);
        return false;
      }
      if (error instanceof ApiError && error.status === 403) {
        missing(error.message);
        return false;
      }
      $("job-reason").textContent = `Could not refresh: ${error.message}`;
      return true;
    }
  }

  async function kill(remove) {
    const label = theirs ? `${theirs}/${name}` : name;
    const question = remove
      ? `Kill job ${label} if it is running, and remove it and its logs from the history?`
      : `Kill job ${label}? Its workers are stopped and it ends as KILLED.`;
    if (!(await ask(question, { ok: remove ? "Kill and remove" : "Kill" }))) return;
    try {
      await api(jobUrl(remove ? { rm: "1" } : {}), { method: "DELETE" });
    } catch (error) {
      $("job-reason").textContent = `Could not kill: ${error.message}`;
      return;
    }
    if (remove) location.assign(theirs ? "/?all_users=1" : "/");
    else {
      stopRefresh();
      stopRefresh = every(REFRESH_MS, refresh);
    }
  }

  $("job-kill").addEventListener("click", () => kill(false));
  $("job-remove").addEventListener("click", () => kill(true));
  stopRefresh = every(REFRESH_MS, refresh);
}

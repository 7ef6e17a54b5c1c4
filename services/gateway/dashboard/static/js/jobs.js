// The jobs list: active jobs (or all of them), refreshed every two seconds.
import { api } from "./api.js";
import { $, age, every, h, stateBadge, when } from "./ui.js";

const REFRESH_MS = 2000;
const LIMIT = 200;

function row(job) {
  const link = h("a", { href: `/jobs/${encodeURIComponent(job.name)}` }, job.name);
  return h(
    "tr",
    { dataset: { job: job.name, state: job.state } },
    h("td", {}, link),
    h("td", {}, stateBadge(job.state)),
    h("td", { class: "num" }, job.spec?.trainers ?? ""),
    h("td", { class: "num" }, job.spec?.pservers ?? ""),
    h("td", { title: when(job.created_at) }, age(job.created_at)),
    h("td", { class: "reason" }, job.reason || ""),
  );
}

export function start() {
  const body = $("jobs-body");
  const all = $("jobs-all");
  const status = $("jobs-status");
  all.checked = new URLSearchParams(location.search).get("all") === "1";

  async function refresh() {
    const query = new URLSearchParams({ limit: String(LIMIT) });
    if (all.checked) query.set("all", "1");
    try {
      const data = await api(`/api/v1/jobs?${query}`);
      body.replaceChildren(...data.jobs.map(row));
      $("jobs-empty").hidden = data.jobs.length > 0;
      status.textContent = data.next_cursor ? `newest ${LIMIT} shown` : "";
      status.classList.remove("error");
    } catch (error) {
      status.textContent = `Could not refresh: ${error.message}`;
      status.classList.add("error");
    }
  }

  let stop = every(REFRESH_MS, refresh);
  all.addEventListener("change", () => {
    const url = new URL(location.href);
    if (all.checked) url.searchParams.set("all", "1");
    else url.searchParams.delete("all");
    history.replaceState(null, "", url);
    stop();
    stop = every(REFRESH_MS, refresh);
  });
}

// The jobs list: active jobs (or all of them), refreshed every two seconds; administrators
// may list every user's, with a User column and links to each job's page as its owner's.
import { api } from "./api.js";
import { $, age, every, h, stateBadge, when } from "./ui.js";

const REFRESH_MS = 2000;
const LIMIT = 200;

function row(job, everyone) {
  const owner = everyone ? `?user=${encodeURIComponent(job.owner)}` : "";
  const link = h("a", { href: `/jobs/${encodeURIComponent(job.name)}${owner}` }, job.name);
  return h(
    "tr",
    { dataset: { job: job.name, state: job.state, owner: job.owner } },
    everyone ? h("td", { class: "owner" }, job.owner) : null,
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
  const allUsers = $("jobs-all-users"); // only on an administrator's page
  const status = $("jobs-status");
  const params = new URLSearchParams(location.search);
  all.checked = params.get("all") === "1";
  if (allUsers) allUsers.checked = params.get("all_users") === "1";

  async function refresh() {
    const query = new URLSearchParams({ limit: String(LIMIT) });
    if (all.checked) query.set("all", "1");
    const everyone = Boolean(allUsers?.checked);
    if (everyone) query.set("all_users", "1");
    try {
      const data = await api(`/api/v1/jobs?${query}`);
      $("jobs-user").hidden = !everyone;
      body.replaceChildren(...data.jobs.map((job) => row(job, everyone)));
      $("jobs-empty").hidden = data.jobs.length > 0;
      status.textContent = data.next_cursor ? `newest ${LIMIT} shown` : "";
      status.classList.remove("error");
    } catch (error) {
      status.textContent = `Could not refresh: ${error.message}`;
      status.classList.add("error");
    }
  }

  let stop = every(REFRESH_MS, refresh);
  for (const [box, key] of [
    [all, "all"],
    [allUsers, "all_users"],
  ]) {
    box?.addEventListener("change", () => {
      const url = new URL(location.href);
      if (box.checked) url.searchParams.set(key, "1");
      else url.searchParams.delete(key);
      history.replaceState(null, "", url);
      stop();
      stop = every(REFRESH_MS, refresh);
    });
  }
}

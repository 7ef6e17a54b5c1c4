// Quota as bars of use against the limits; administrators also see every user's quota
// and can change it, and set a new password for a user who forgot theirs.
import { api } from "./api.js";
import { $, ask, bytes, h } from "./ui.js";

// 18 random bytes, 24 URL-safe characters: as strong as `paddlecloud users create` makes.
export function newPassword() {
  const random = crypto.getRandomValues(new Uint8Array(18));
  return btoa(String.fromCharCode(...random)).replaceAll("+", "-").replaceAll("/", "_");
}

async function resetPassword(user) {
  const notice = $("password-notice");
  const question = `Set a new password for ${user.name}? Every session of ${user.name} ends.`;
  if (!(await ask(question, { ok: "Set a new password" }))) return;
  const password = newPassword();
  notice.hidden = false;
  notice.classList.remove("error");
  try {
    await api(`/api/v1/users/${encodeURIComponent(user.name)}/password`, { method: "PUT", body: { password } });
  } catch (error) {
    notice.textContent = `Could not set the password: ${error.message}`;
    notice.classList.add("error");
    return;
  }
  // Shown once, here only: pass it on; it is stored nowhere but as a hash.
  notice.replaceChildren(
    `New password for ${user.name} (shown only this once): `,
    h("code", { id: "new-password" }, password),
  );
}

const RESOURCES = [
  ["cpu", "CPU"],
  ["gpu", "GPU"],
  ["memory", "Memory"],
  ["jobs", "Running jobs"],
  ["storage", "Storage"],
  ["disk", "Disk"],
];
const SUFFIXES = { m: 1e-3, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18 };
for (const [i, s] of ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"].entries()) SUFFIXES[s] = 1024 ** (i + 1);

// A Kubernetes quantity ("2500m", "3Gi", 4) as a number, to draw a bar.
export function quantity(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === "number") return value;
  const match = /^([0-9.]+)([a-zA-Z]*)$/.exec(String(value).trim());
  if (!match) return Number.NaN;
  return Number(match[1]) * (match[2] ? (SUFFIXES[match[2]] ?? Number.NaN) : 1);
}

// The API answers Kubernetes quantities, which for bytes in use are often just digits
// ("1500000"); people read sizes as "1.4 MiB".
const SIZES = new Set(["memory", "storage", "disk"]);

export function shown(key, value) {
  return SIZES.has(key) && value !== null && value !== undefined ? bytes(quantity(value)) : value;
}

function bar(key, label, usage) {
  const used = quantity(usage.used);
  const limit = quantity(usage.limit);
  const [usedText, limitText] = [shown(key, usage.used), shown(key, usage.limit)];
  const text = limit === null ? `${usedText} used, no limit` : `${usedText} of ${limitText}`;
  const meter =
    limit === null
      ? h("span", { class: "muted" }, "unlimited")
      : h("meter", { min: 0, max: limit || 1, value: used, high: (limit || 1) * 0.9, optimum: 0 });
  return [h("dt", {}, label), h("dd", { dataset: { resource: key } }, meter, " ", h("span", {}, text))];
}

// What the bars do not say: limits and the storage quota that are only counted here.
export function notes(machine) {
  const found = [];
  if (machine.limits === "advisory") found.push(`Limits are advisory here: ${machine.limits_detail}`);
  if (machine.storage === "advisory") found.push(`Storage quota: ${machine.storage_detail}`);
  return found;
}

async function showQuota() {
  try {
    const quota = await api("/api/v1/quota");
    $("quota-bars").replaceChildren(...RESOURCES.flatMap(([key, label]) => bar(key, label, quota[key])));
    $("quota-notes").replaceChildren(...notes(quota.machine ?? {}).map((text) => h("li", {}, text)));
  } catch (error) {
    $("quota-status").textContent = error.message;
  }
}

function userRow(user, edit, me) {
  const q = user.quota;
  // Sizes read as people read them; the exact quantity (what Edit takes) is the tooltip.
  const cell = (v, key = "") => h("td", { title: SIZES.has(key) ? v : null }, shown(key, v) ?? "—");
  return h(
    "tr",
    { dataset: { user: user.name } },
    h("td", {}, user.name),
    h("td", {}, user.admin ? "yes" : ""),
    cell(q.cpu),
    cell(q.gpu),
    cell(q.memory, "memory"),
    cell(q.jobs),
    cell(q.storage, "storage"),
    cell(q.disk, "disk"),
    h("td", {}, h("button", { class: "link", onclick: () => edit(user) }, "Edit")),
    h(
      "td",
      {},
      user.name === me
        ? h("a", { href: "/account" }, "Change password")
        : h("button", { class: "link reset", onclick: () => resetPassword(user) }, "Reset password"),
    ),
  );
}

async function showUsers(me) {
  const dialog = $("quota-dialog");
  const form = $("quota-form");
  let editing = null;
  const edit = (user) => {
    editing = user;
    $("quota-user").textContent = user.name;
    $("quota-error").textContent = "";
    for (const [key] of RESOURCES) form.elements[key].value = user.quota[key] ?? "";
    dialog.showModal();
  };
  const refresh = async () => {
    const { users } = await api("/api/v1/users");
    $("users-body").replaceChildren(...users.map((u) => userRow(u, edit, me)));
  };
  form.addEventListener("submit", async (event) => {
    if (event.submitter?.value !== "ok") return;
    event.preventDefault();
    const body = {};
    for (const [key] of RESOURCES) {
      const text = form.elements[key].value.trim();
      body[key] = text === "" ? null : ["gpu", "jobs"].includes(key) ? Number(text) : text;
    }
    try {
      await api(`/api/v1/users/${encodeURIComponent(editing.name)}/quota`, { method: "PUT", body });
    } catch (error) {
      $("quota-error").textContent = error.message;
      return;
    }
    dialog.close();
    await refresh();
    await showQuota();
  });
  await refresh();
}

export function start(data) {
  showQuota();
  if (data.admin === "1") showUsers(data.user);
}

// Small DOM helpers: elements are built with textContent, never from HTML strings.

export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "class") element.className = value;
    else if (key === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

export const $ = (id) => document.getElementById(id);

export function age(iso, now = Date.now()) {
  if (!iso) return "";
  const seconds = Math.max(0, Math.floor((now - Date.parse(iso)) / 1000));
  if (seconds < 120) return `${seconds}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 120) return `${minutes}m`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours}h`;
  return `${Math.floor(hours / 24)}d`;
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

export function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let value = Number(n);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

export function stateBadge(state) {
  return h("span", { class: `state state-${String(state).toLowerCase()}` }, state);
}

export const FINAL_STATES = new Set(["SUCCEEDED", "FAILED", "KILLED"]);

// A confirmation (and optionally one text field) in the page's <dialog id="confirm">.
// Resolves to the text (or true) on OK, to null on Cancel.
export function ask(text, { ok = "OK", danger = true, input = null, value = "" } = {}) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  const button = $("confirm-ok");
  button.textContent = ok;
  button.className = danger ? "danger" : "";
  const label = $("confirm-input-label");
  const field = $("confirm-input");
  label.hidden = input === null;
  $("confirm-input-caption").textContent = input || "";
  field.value = value;
  dialog.returnValue = "";
  dialog.showModal();
  if (input !== null) field.select();
  return new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        if (dialog.returnValue !== "ok") resolve(null);
        else resolve(input === null ? true : field.value.trim());
      },
      { once: true },
    );
  });
}

export function showError(element, error) {
  element.hidden = false;
  element.textContent = error instanceof Error ? error.message : String(error);
  element.classList.add("error");
}

// Repeats `task` every `ms` while the page is visible, at once when it becomes visible
// again, until the task returns false; returns a function that stops it.
export function every(ms, task) {
  let timer = null;
  let stopped = false;
  const run = async () => {
    timer = null;
    if (stopped) return;
    if (document.visibilityState !== "hidden" && (await task()) === false) stopped = true;
    if (!stopped) timer = setTimeout(run, ms);
  };
  const onVisible = () => {
    if (document.visibilityState === "visible" && timer !== null) {
      clearTimeout(timer);
      run();
    }
  };
  document.addEventListener("visibilitychange", onVisible);
  run();
  return () => {
    stopped = true;
    if (timer !== null) clearTimeout(timer);
    document.removeEventListener("visibilitychange", onVisible);
  };
}

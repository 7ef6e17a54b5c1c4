// The file browser: your home and public, list, download, new folder, rename, delete,
// and uploads of files and folders (picked or dropped) with a progress bar each.
import { ApiError, api, pfsUrl } from "./api.js";
import { $, ask, bytes, h, showError, when } from "./ui.js";
import { problemOf, uploadFile } from "./upload.js";

let data;
let current;
let missing = false; // the current folder answered 404

const parentOf = (path) => path.slice(0, path.lastIndexOf("/"));
const join = (dir, name) => `${dir}/${name}`;
const filesHref = (path) => `/files?${new URLSearchParams({ path })}`;

function writable(path) {
  return data.admin === "1" || path === data.home || path.startsWith(`${data.home}/`);
}

function crumbs(path) {
  // /pfs/<dc>/home/<user>/a/b: the first clickable step is the home (or public).
  const base = path === data.public || path.startsWith(`${data.public}/`) ? data.public : data.home;
  const parts = [h("a", { href: filesHref(base) }, base === data.public ? "public" : "home")];
  if (path.startsWith(`${base}/`)) {
    let at = base;
    for (const name of path.slice(base.length + 1).split("/")) {
      at = join(at, name);
      parts.push(" / ", h("a", { href: filesHref(at) }, name));
    }
  } else if (path !== base) {
    parts.splice(0, 1, path);
  }
  return parts;
}

function entryRow(entry) {
  const isDir = entry.type === "dir";
  const link = isDir
    ? h("a", { href: filesHref(entry.path), class: "dir" }, `${entry.name}/`)
    : h("a", { href: pfsUrl("files", entry.path), download: entry.name, class: "file" }, entry.name);
  const actions = h("td", { class: "actions" });
  if (writable(entry.path)) {
    actions.append(
      h("button", { class: "link", onclick: () => rename(entry) }, "Rename"),
      h("button", { class: "link danger", onclick: () => remove(entry) }, "Delete"),
    );
  }
  return h(
    "tr",
    { dataset: { path: entry.path, type: entry.type } },
    h("td", {}, link),
    h("td", { class: "num" }, isDir ? "" : bytes(entry.size)),
    h("td", { title: entry.mtime }, when(entry.mtime)),
    actions,
  );
}

function message(text, isError = false) {
  const element = $("files-message");
  element.hidden = !text;
  element.textContent = text;
  element.classList.toggle("error", isError);
}

// Whether the current folder can take uploads and new folders: it is the user's and it exists.
function canWrite() {
  return writable(current) && !missing;
}

// A folder that is not there has nothing to list and nothing to upload into (an upload
// would make it silently): one notice, the crumbs above it to go back, and no tools.
function showMissing(error) {
  missing = true;
  const known = current.startsWith(`${data.home}/`) || current.startsWith(`${data.public}/`);
  message(known && error.code === "ERR_PATH_NOT_FOUND" ? "No such folder." : error.message, true);
}

async function list() {
  $("crumbs").replaceChildren(...crumbs(current));
  message("");
  try {
    const listing = await api(pfsUrl("ls", current));
    missing = false;
    const entries = listing.entries.filter((e) => e.path !== current);
    entries.sort((a, b) => (b.type === "dir") - (a.type === "dir") || a.name.localeCompare(b.name));
    $("files-body").replaceChildren(...entries.map(entryRow));
    if (entries.length === 0) message("This folder is empty.");
  } catch (error) {
    $("files-body").replaceChildren();
    if (error instanceof ApiError && error.status === 404 && current === data.home) {
      message("Your home is empty: it is made on your first upload.");
    } else if (error instanceof ApiError && error.status === 404) {
      showMissing(error);
    } else if (error instanceof ApiError && error.status === 403) {
      message(`You cannot open ${current}: ${error.message}`, true);
    } else {
      message(error.message, true);
    }
  }
  $("files-tools").hidden = !canWrite();
  $("files-table").hidden = missing;
  $("drop-hint").hidden = !canWrite();
}

async function act(work) {
  try {
    await work();
  } catch (error) {
    message(error.message, true);
    return;
  }
  await list();
}

async function rename(entry) {
  const name = await ask(`Rename ${entry.name} to:`, { ok: "Rename", danger: false, input: "New name", value: entry.name });
  if (!name || name === entry.name) return;
  await act(() => api("/api/v1/pfs/mv", { method: "POST", body: { src: entry.path, dst: join(parentOf(entry.path), name) } }));
}

async function remove(entry) {
  const what = entry.type === "dir" ? `the folder ${entry.name} and everything in it` : entry.name;
  if (!(await ask(`Delete ${what}? This cannot be undone.`, { ok: "Delete" }))) return;
  await act(() => api(pfsUrl("files", entry.path, entry.type === "dir" ? { recursive: "1" } : {}), { method: "DELETE" }));
}

async function mkdir() {
  const name = await ask("New folder in this one:", { ok: "Create", danger: false, input: "Name" });
  if (!name) return;
  await act(() => api("/api/v1/pfs/mkdir", { method: "POST", body: { path: join(current, name), parents: false } }));
}

// Uploads run one at a time, in the order they were asked for.
const queue = [];
let busy = false;

function enqueue(file, relative) {
  const dest = join(current, relative);
  const bar = h("progress", { max: file.size || 1, value: 0 });
  const status = h("span", { class: "status" }, "waiting");
  const item = h("li", { dataset: { dest, state: "waiting", acknowledged: "0" } }, h("span", { class: "name" }, relative), bar, status);
  $("upload-list").append(item);
  $("uploads").hidden = false;
  queue.push({ file, dest, item, bar, status });
  if (!busy) drain();
}

// Why an upload failed, in the page's words: the server's detail speaks tus ("metadata
// 'overwrite 1'"), while here the way to replace a file is the checkbox above the list.
function uploadFailure(error) {
  const problem = problemOf(error);
  if (problem.code === "ERR_ALREADY_EXISTS") {
    return "a file of this name is already here; tick “replace existing files” to replace it.";
  }
  return problem.detail || error.message; // not a problem document: tus-js-client's own words
}

async function drain() {
  busy = true;
  while (queue.length) {
    const { file, dest, item, bar, status } = queue.shift();
    const set = (state, text) => {
      item.dataset.state = state;
      status.textContent = text;
    };
    set("running", "starting…");
    try {
      const sha = await uploadFile(file, dest, {
        user: data.user,
        overwrite: $("upload-overwrite").checked,
        on: {
          status: (text) => set("running", text),
          hashing: (done, total) => set("running", `computing its sha256… ${Math.floor((100 * done) / (total || 1))}%`),
          resumed: (offset, total) => {
            item.dataset.resumedAt = String(offset);
            bar.value = offset;
            set("running", `resumed at ${bytes(offset)} of ${bytes(total)}`);
          },
          progress: (accepted, total) => {
            item.dataset.acknowledged = String(accepted);
            bar.value = accepted;
            set("running", `${bytes(accepted)} of ${bytes(total)}`);
          },
        },
      });
      bar.value = bar.max;
      item.dataset.sha256 = sha || "";
      set("done", `done, sha256 ${sha ? sha.slice(0, 12) : "verified"}…`);
      if (parentOf(dest) === current || dest.startsWith(`${current}/`)) await list();
    } catch (error) {
      set("failed", `failed: ${uploadFailure(error)}`);
    }
  }
  busy = false;
}

function pick(input) {
  for (const file of input.files) enqueue(file, file.webkitRelativePath || file.name);
  input.value = "";
}

// A dropped folder arrives as a tree of entries, read a batch at a time.
async function walk(entry, prefix) {
  if (entry.isFile) {
    const file = await new Promise((resolve, reject) => entry.file(resolve, reject));
    enqueue(file, prefix + entry.name);
  } else if (entry.isDirectory) {
    const reader = entry.createReader();
    for (;;) {
      const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
      if (batch.length === 0) break;
      for (const child of batch) await walk(child, `${prefix}${entry.name}/`);
    }
  }
}

function setUpDrop() {
  const zone = $("dropzone");
  zone.addEventListener("dragover", (event) => {
    if (!canWrite()) return;
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", async (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    if (!canWrite()) return;
    const entries = [...event.dataTransfer.items].map((item) => item.webkitGetAsEntry?.()).filter(Boolean);
    if (entries.length) for (const entry of entries) await walk(entry, "");
    else for (const file of event.dataTransfer.files) enqueue(file, file.name);
  });
}

export function start(pageData) {
  data = pageData;
  current = new URLSearchParams(location.search).get("path") || data.home;
  while (current.length > 1 && current.endsWith("/")) current = current.slice(0, -1);
  $("root-home").href = filesHref(data.home);
  $("root-public").href = filesHref(data.public);
  $("files-mkdir").addEventListener("click", mkdir);
  $("upload-files").addEventListener("change", (event) => pick(event.target));
  $("upload-folder").addEventListener("change", (event) => pick(event.target));
  setUpDrop();
  list().catch((error) => showError($("files-message"), error));
}

// The dashboard's entry point: runs the module of the page the server rendered.
const pages = {
  jobs: () => import("./jobs.js"),
  job: () => import("./job.js"),
  files: () => import("./files.js"),
  quota: () => import("./quota.js"),
};

const load = pages[document.body.dataset.page];
if (load) {
  load().then((module) => module.start(document.body.dataset));
}

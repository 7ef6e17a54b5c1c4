// The dashboard's entry point: runs the module of the page the server rendered.
const pages = {
  jobs: () => import("./jobs.js"),
  job: () => import("./job.js"),
  files: () => import("./files.js"),
  quota: () => import("./quota.js"),
  account: () => import("./account.js"),
};

const load = pages[document.body.dataset.page];
if (load) {
  // data-ready tells a reader (and the browser tests) that the page's controls now work.
  load().then((module) => {
    module.start(document.body.dataset);
    document.body.dataset.ready = "1";
  });
}

// The job page's charts (docs/metrics.md §3): the training scalars, one chart per tag
// with a line per worker, and the resource series per worker, drawn with the vendored
// uPlot (a classic script: `window.uPlot`). Polled while the job runs, and once more
// after it has ended.
import { api } from "./api.js";
import { $, every, h } from "./ui.js";

const POLL_MS = 5000;
const HEIGHT = 220;
// The page's own colours first (style.css), then distinct ones that read on white.
const PALETTE = ["#1f5fbf", "#b54708", "#067647", "#b42318", "#6941c6", "#0e7490", "#c11574", "#4d5761"];
const AXIS = {
  stroke: "#5b6475",
  grid: { stroke: "#e4e7ec", width: 1 },
  ticks: { stroke: "#d9dde5", width: 1 },
};
const KiB = 1024;
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
// Byte axes tick at powers of two (64 MiB, 128 MiB...), not at 100,000,000.
const BYTE_STEPS = UNITS.flatMap((_, power) =>
  [1, 2, 4, 8, 16, 32, 64, 128, 256, 512].map((m) => m * KiB ** power),
);

function formatBytes(value) {
  if (value === null || value === undefined) return "–";
  let n = Math.abs(value);
  let unit = 0;
  while (n >= KiB && unit < UNITS.length - 1) {
    n /= KiB;
    unit += 1;
  }
  const digits = unit === 0 || n >= 100 || Number.isInteger(n) ? 0 : 1;
  return `${value < 0 ? "-" : ""}${n.toFixed(digits)} ${UNITS[unit]}`;
}

function formatNumber(value) {
  if (value === null || value === undefined) return "–";
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return String(Number(value.toPrecision(4)));
}

// The chart kinds: how values read in the legend, and on the y axis where uPlot's own
// numbers (decimals as fine as the ticks' spacing) would not say the unit.
const UNIT = {
  scalar: { format: formatNumber },
  cores: { format: (v) => (v === null || v === undefined ? "–" : `${formatNumber(v)} cores`) },
  bytes: { format: formatBytes, axis: formatBytes, incrs: BYTE_STEPS },
  percent: {
    format: (v) => (v === null || v === undefined ? "–" : `${formatNumber(v)} %`),
    axis: (v) => `${v} %`,
  },
};
// Steps are whole numbers: a zoomed step axis ticks at 1, 2, 5, 10... never at 27.5.
const STEP_INCRS = [1, 2, 5]
  .flatMap((m) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8].map((p) => m * p))
  .sort((a, b) => a - b);
// Resource axes start at zero, so that a line's height reads as the amount it is; CPU's
// goes to one core at least, so that an idle worker looks idle, not busy with noise.
const FROM_ZERO = (u, min, max) => [0, max > 0 ? max * 1.05 : 1];
const CORES = (u, min, max) => [0, Math.max(1, max * 1.05)];
// The y axis as wide as its longest label (about 7 px a character at 12 px).
const AXIS_SIZE = (u, values) => 16 + 7 * Math.max(3, ...(values || []).map((v) => String(v).length));

// Aligns series that each have their own x values on the union of them (uPlot draws
// columns that share one x array); a missing value is null, which `spanGaps` bridges.
// Where one series repeats an x (a restarted worker logging a step again), the last wins.
function align(list) {
  const xs = [...new Set(list.flatMap((s) => s.x))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const columns = list.map((s) => {
    const ys = new Array(xs.length).fill(null);
    s.x.forEach((x, i) => {
      ys[at.get(x)] = s.y[i] ?? null;
    });
    return ys;
  });
  return [xs, ...columns];
}

// One chart: a <figure> with its caption, a uPlot drawn as wide as the figure (uPlot
// takes sizes in pixels; a ResizeObserver follows the page's width) and its legend.
class Chart {
  constructor(parent, { key, title, unit, xLabel, time, range }) {
    this.unit = UNIT[unit];
    this.range = range;
    this.xLabel = xLabel;
    this.time = time;
    this.title = title;
    this.plot = h("div", { class: "plot", role: "img", "aria-label": title });
    this.figure = h(
      "figure",
      { class: "chart", dataset: { chart: key } },
      h("figcaption", {}, title),
      this.plot,
    );
    parent.append(this.figure);
    this.uplot = null;
    this.labels = "";
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(this.plot);
  }

  width() {
    return Math.max(200, Math.floor(this.plot.clientWidth));
  }

  resize() {
    if (this.uplot && this.uplot.width !== this.width())
      this.uplot.setSize({ width: this.width(), height: HEIGHT });
  }

  // `lines`: [{label, x, y, colour, limit}]; a limit is drawn dashed and not counted.
  set(lines) {
    const data = align(lines);
    const labels = lines.map((l) => `${l.label}|${l.colour}|${l.limit ? 1 : 0}`).join(",");
    // A reader who zoomed in keeps that view while new points come (a double click zooms
    // back out to the whole series, which then follows the new points again).
    if (this.uplot && labels === this.labels) this.uplot.setData(data, !this.zoomed);
    else {
      this.zoomed = false;
      this.uplot?.destroy();
      this.labels = labels;
      this.uplot = new window.uPlot(this.options(lines), data, this.plot);
    }
    this.plot.setAttribute("aria-label", this.describe(lines));
  }

  options(lines) {
    const unit = this.unit;
    const figure = this.figure;
    const counted = lines.map((l) => !l.limit);
    return {
      width: this.width(),
      height: HEIGHT,
      scales: { x: { time: this.time }, y: this.range ? { range: this.range } : {} },
      series: [
        { label: this.xLabel, value: this.time ? "{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}" : (u, v) => v ?? "–" },
        ...lines.map((l) => ({
          label: l.label,
          stroke: l.colour,
          width: l.limit ? 1.5 : 2,
          dash: l.limit ? [6, 4] : undefined,
          spanGaps: true,
          points: { show: false },
          value: (u, v) => unit.format(v),
        })),
      ],
      axes: [
        this.time ? AXIS : { ...AXIS, label: this.xLabel, labelSize: 20, incrs: STEP_INCRS },
        {
          ...AXIS,
          size: AXIS_SIZE,
          ...(unit.axis ? { values: (u, ticks) => ticks.map(unit.axis) } : {}),
          ...(unit.incrs ? { incrs: unit.incrs } : {}),
        },
      ],
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      hooks: {
        setScale: [
          (u, key) => {
            const xs = u.data[0];
            if (key !== "x" || !xs.length) return;
            this.zoomed = u.scales.x.min > xs[0] || u.scales.x.max < xs[xs.length - 1];
          },
        ],
        // What the page drew, for a reader's tools and the browser tests: the number of
        // values in the lines that carry data (limits left out).
        draw: [
          (u) => {
            let points = 0;
            u.data.slice(1).forEach((ys, i) => {
              if (counted[i]) points += ys.filter((y) => y !== null && y !== undefined).length;
            });
            figure.dataset.points = String(points);
          },
        ],
      },
    };
  }

  describe(lines) {
    const last = lines
      .filter((l) => !l.limit && l.y.length)
      .map((l) => `${l.label} ${this.unit.format(l.y[l.y.length - 1])}`);
    return `${this.title}: ${last.length ? `latest ${last.join(", ")}` : "no values yet"}`;
  }

  remove() {
    this.observer.disconnect();
    this.uplot?.destroy();
    this.figure.remove();
  }
}

// Charts of one kind, by key, kept between polls so that a redraw is only setData.
class ChartSet {
  constructor(container) {
    this.container = container;
    this.charts = new Map();
  }

  show(specs) {
    const keys = new Set(specs.map((s) => s.key));
    for (const [key, chart] of this.charts) {
      if (!keys.has(key)) {
        chart.remove();
        this.charts.delete(key);
      }
    }
    for (const spec of specs) {
      let chart = this.charts.get(spec.key);
      if (!chart) {
        chart = new Chart(this.container, spec);
        this.charts.set(spec.key, chart);
      }
      // Keep the charts in the order given (tags by name, resources as listed).
      this.container.append(chart.figure);
      chart.set(spec.lines);
    }
  }
}

// A colour per worker that stays the same across polls and charts.
class Colours {
  constructor() {
    this.known = new Map();
  }

  of(name) {
    if (!this.known.has(name)) this.known.set(name, PALETTE[this.known.size % PALETTE.length]);
    return this.known.get(name);
  }
}

function scalarSpecs(answer, colours) {
  const byTag = new Map();
  for (const s of answer.series || []) {
    // VisualDL and TensorBoard series are named by their run (a log directory).
    const label = s.source && s.source !== "sdk" ? `${s.worker} (${s.source})` : s.worker;
    if (!byTag.has(s.tag)) byTag.set(s.tag, []);
    byTag.get(s.tag).push({ label, x: s.step, y: s.value, colour: colours.of(label) });
  }
  return [...byTag.keys()].sort().map((tag) => ({
    key: `scalar:${tag}`,
    title: tag,
    unit: "scalar",
    xLabel: "step",
    time: false,
    lines: byTag.get(tag).sort((a, b) => a.label.localeCompare(b.label, undefined, { numeric: true })),
  }));
}

const hasValues = (ys) => (ys || []).some((y) => y !== null && y !== undefined);

function resourceSpecs(answer, colours) {
  const workers = answer.workers || [];
  // Samples of one round differ by milliseconds between workers: rounded to whole seconds
  // (half the interval where that is shorter) they share an x, so the legend shows every
  // worker's figure at the cursor.
  const grain = Math.min(1, (answer.interval_seconds || 1) / 2);
  const at = (w) => (w.t || []).map((t) => Math.round(t / grain) * grain);
  const line = (w, field) => ({ label: w.worker, x: at(w), y: w[field] || [], colour: colours.of(w.worker) });
  const memory = [];
  for (const w of workers) {
    memory.push(line(w, "memory_bytes"));
    if (w.memory_limit_bytes !== null && w.memory_limit_bytes !== undefined && w.t.length) {
      const limit = w.t.map(() => w.memory_limit_bytes);
      memory.push({
        label: `${w.worker} limit`,
        x: at(w),
        y: limit,
        colour: colours.of(w.worker),
        limit: true,
      });
    }
  }
  const specs = [
    {
      key: "cpu",
      title: "CPU (cores)",
      unit: "cores",
      range: CORES,
      lines: workers.map((w) => line(w, "cpu_cores")),
    },
    { key: "memory", title: "Memory (dashed: the limit)", unit: "bytes", lines: memory },
  ];
  // GPU charts only where some worker has GPU figures: null on a CPU worker.
  const gpu = workers.filter((w) => hasValues(w.gpu_utilization) || hasValues(w.gpu_memory_bytes));
  if (gpu.some((w) => hasValues(w.gpu_utilization))) {
    specs.push({
      key: "gpu",
      title: "GPU utilisation",
      unit: "percent",
      range: [0, 100],
      lines: gpu.map((w) => line(w, "gpu_utilization")),
    });
  }
  if (gpu.some((w) => hasValues(w.gpu_memory_bytes))) {
    specs.push({
      key: "gpu-memory",
      title: "GPU memory",
      unit: "bytes",
      lines: gpu.map((w) => line(w, "gpu_memory_bytes")),
    });
  }
  return specs.map((s) => ({ range: FROM_ZERO, ...s, xLabel: "time", time: true }));
}

function note(id, text) {
  const element = $(id);
  element.textContent = text || "";
  element.hidden = !text;
}

// The charts section of one job's page. `url(path)` is the job's API address for a
// sub-resource; `isFinal()` says whether the job had ended when last seen.
export class JobCharts {
  constructor({ url, isFinal }) {
    this.url = url;
    this.isFinal = isFinal;
    this.colours = new Colours();
    this.scalars = new ChartSet($("scalar-charts"));
    this.resources = new ChartSet($("resource-charts"));
    this.section = $("charts");
  }

  start() {
    if (!window.uPlot) {
      note("scalars-note", "The charts could not load (static/vendor/uPlot.iife.min.js).");
      return;
    }
    this.section.dataset.live = "1";
    this.stop = every(POLL_MS, () => this.poll());
  }

  // Stops the polling (the job has gone); start() replaces this with its loop's stopper.
  stop() {}

  async poll() {
    // The fetch that starts after the job is seen to have ended is the last.
    const ended = this.isFinal();
    await Promise.all([this.pollScalars(), this.pollResources()]);
    if (ended) this.section.dataset.live = "0";
    return !ended;
  }

  async pollScalars() {
    try {
      const answer = await api(this.url("metrics"));
      const specs = scalarSpecs(answer, this.colours);
      this.scalars.show(specs);
      // What the jobs service could not read (a malformed line, a cut file), in its words.
      const warnings = (answer.warnings || []).join(" ");
      const empty = specs.length
        ? ""
        : "No training curves yet: a training program logs them with paddlecloud.metrics.log(step=..., loss=...).";
      note("scalars-note", [empty, warnings && `Not read: ${warnings}`].filter(Boolean).join(" "));
    } catch (error) {
      note("scalars-note", `Could not read the training curves: ${error.message || error}`);
    }
  }

  async pollResources() {
    try {
      const answer = await api(this.url("resources"));
      if (answer.available === false) {
        this.resources.show([]);
        note(
          "resources-note",
          `Resource use is not shown: ${answer.reason || "not available on this cluster"}.`,
        );
        return;
      }
      const sampled = (answer.workers || []).some((w) => w.t && w.t.length);
      this.resources.show(sampled ? resourceSpecs(answer, this.colours) : []);
      note("resources-note", sampled ? "" : "No resource samples yet.");
    } catch (error) {
      note("resources-note", `Could not read the resource figures: ${error.message || error}`);
    }
  }
}

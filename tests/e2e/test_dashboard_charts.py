"""The job page's charts in a real browser against a real `paddlecloud server`: a job that
logs 50 steps of loss with the SDK shows them drawn, with its resource use, at a laptop's
width and a phone's. The charts' screenshots in docs/ come from here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_dashboard import browser, context, no_leaked_tasks, platform, ready, screenshot_dir, sign_in

__all__ = ["browser", "context", "no_leaked_tasks", "platform"]  # fixtures, as test_dashboard.py has them

pytestmark = pytest.mark.slow

# Logs 50 steps of loss (and accuracy) and a line that is no record, holds some memory
# (written, so it is resident), keeps a quarter of a core busy for the CPU chart, and stays
# RUNNING until the test writes `go`: the test decides when the job ends, with no timing
# involved in what it asserts.
CURVES_PY = """\
import os, time
import paddlecloud.metrics

home = os.environ["PADDLE_CLOUD_PFS_HOME"]
for i in range(50):
    paddlecloud.metrics.log(step=i, loss=2.0 / (i + 1), acc=1.0 - 0.5 / (i + 1))
with open(paddlecloud.metrics.metrics_path(), "a") as spoilt:
    spoilt.write("not a record\\n")
print("logged 50 steps", flush=True)
held = b"x" * (96 * 1024 * 1024)
while not os.path.exists(os.path.join(home, "go")):
    busy = time.monotonic() + 0.025
    while time.monotonic() < busy:
        pass
    time.sleep(0.075)
print("done", flush=True)
"""

# How much of a chart's canvas its line covers: the pixels of the line's colour (the
# legend's marker says which) in the left, middle and right thirds of the canvas.
INK = """([figure, colour]) => {
  const canvas = figure.querySelector("canvas");
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const [r, g, b] = colour.match(/\\d+/g).map(Number);
  const thirds = [0, 0, 0];
  for (let i = 0; i < data.length; i += 4) {
    const near = Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 60;
    const x = (i / 4) % canvas.width;
    if (near && data[i + 3] > 200) thirds[Math.min(2, Math.floor((x * 3) / canvas.width))] += 1;
  }
  return thirds;
}"""

POINTS_AT_LEAST = (
    "([key, n]) => Number(document.querySelector(`figure[data-chart='${key}']`)?.dataset.points) >= n"
)


def require_apis(page: Any, endpoint: str, name: str) -> None:
    """Fail (not skip) with what is missing where the series' APIs are not on this branch."""
    for sub, what in (
        ("metrics", "scalars API (branch fix-S)"),
        ("resources", "resource series API (branch fix-R)"),
    ):
        status = page.request.get(f"{endpoint}/api/v1/jobs/{name}/{sub}").status
        if status == 404:
            pytest.fail(f"GET /api/v1/jobs/{name}/{sub} answers 404: the {what} is not merged here")


def ink(figure: Any) -> list[int]:
    colour = figure.locator(".u-legend .u-series:nth-child(2) .u-marker").evaluate(
        "m => getComputedStyle(m).borderColor"
    )
    return list(figure.evaluate(f"(f, c) => ({INK})([f, c])", colour))


def test_a_job_page_draws_the_loss_the_sdk_logged_and_the_resource_use_at_any_width(
    platform: Any, context: Any, tmp_path: Path
) -> None:
    shots = screenshot_dir(tmp_path)
    package = tmp_path / "curves"
    package.mkdir()
    (package / "train.py").write_text(CURVES_PY)
    platform.cli("--datacenter", "as-alice", "submit", "--jobname", "curves", "--memory", "1Gi", str(package))
    try:
        _draws_and_stops(platform, context, shots)
    finally:
        # The job waits for `go` and keeps a quarter core busy: a failure above must not
        # leave it running past the server (its supervisor outlives the service by design).
        platform.cli("--datacenter", "as-alice", "kill", "curves", check=False)


def _draws_and_stops(platform: Any, context: Any, shots: Path) -> None:
    page = context.new_page()
    page.set_viewport_size({"width": 1400, "height": 900})
    sign_in(page, platform, "alice")
    require_apis(page, platform.endpoint, "curves")
    page.goto(f"{platform.endpoint}/jobs/curves")
    ready(page)
    page.locator("#log-lines .line", has_text="logged 50 steps").wait_for()

    # The loss, drawn: a canvas of a real size, a legend naming the worker, 50 points, and
    # the line's own colour across the whole width of the plot.
    loss = page.locator("figure[data-chart='scalar:loss'][data-points='50']")
    loss.wait_for()
    assert loss.locator("figcaption").inner_text() == "loss"
    assert "trainer-0" in loss.locator(".u-legend").inner_text()
    box = loss.locator("canvas").bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 100
    left, middle, right = ink(loss)
    assert min(left, middle, right) > 20, f"the loss line's pixels by third: {left, middle, right}"
    assert "trainer-0" in (loss.locator(".plot").get_attribute("aria-label") or "")
    # What the service could not read is said under the curves, in its words.
    page.locator("#scalars-note", has_text="Not read: metrics/trainer-0.jsonl: 1 malformed").wait_for()

    # Resource use while the job runs: memory with its limit, in bytes; CPU in cores.
    page.wait_for_function(POINTS_AT_LEAST, arg=["memory", 2])
    page.wait_for_function(POINTS_AT_LEAST, arg=["cpu", 2])
    memory = page.locator("figure[data-chart='memory']")
    assert "trainer-0 limit" in memory.locator(".u-legend").inner_text()
    assert max(ink(memory)) > 0
    memory.locator(".u-over").hover()
    assert "MiB" in memory.locator(".u-legend").inner_text()
    assert page.locator("#resources-note").is_hidden()
    # The viewers' own pages never run on the dashboard's origin (docs/metrics.md §4): the
    # page gives the command that serves them on a loopback origin of their own.
    assert page.inner_text("#job-tensorboard") == "paddlecloud tensorboard curves"
    page.locator("#charts").screenshot(path=str(shots / "dashboard-charts.png"))

    # On a phone's width the charts redraw to fit: one a row, nothing wider than the page.
    page.set_viewport_size({"width": 420, "height": 900})
    page.wait_for_function(
        "() => [...document.querySelectorAll('figure.chart canvas')].every("
        "c => c.getBoundingClientRect().right <= document.documentElement.clientWidth)"
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= 420
    narrow = loss.locator("canvas").bounding_box()
    assert narrow is not None and 250 < narrow["width"] < 420
    page.locator("#charts").screenshot(path=str(shots / "dashboard-charts-narrow.png"))

    # Dragging across the loss zooms in on steps 25 to 40 or so, and the next poll's points
    # leave that view as it is: the plot's left edge still reads a step past 20.
    over = loss.locator(".u-over")
    over.scroll_into_view_if_needed()
    plot = over.bounding_box()
    assert plot is not None
    page.mouse.move(plot["x"] + plot["width"] * 0.5, plot["y"] + 20)
    page.mouse.down()
    page.mouse.move(plot["x"] + plot["width"] * 0.8, plot["y"] + 20, steps=5)
    page.mouse.up()
    for _ in range(2):  # the second poll starts only once the first one's points are drawn
        with page.expect_response(lambda answer: "/curves/metrics" in answer.url):
            pass
    over.hover(position={"x": 2, "y": 20})
    assert int(loss.locator(".u-legend .u-series:first-child .u-value").inner_text()) > 20

    # The job ends: one last poll, and the charts stop, keeping what they drew.
    go = platform.home / "go"
    go.write_text("go")
    platform.cli("--datacenter", "as-alice", "cp", str(go), "pfs:go")
    page.locator("body[data-state='SUCCEEDED']").wait_for()
    page.locator("#charts[data-live='0']").wait_for()
    assert loss.get_attribute("data-points") == "50"

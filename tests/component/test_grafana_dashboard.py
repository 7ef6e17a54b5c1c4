"""The chart's Grafana dashboard against the services' real /metrics: every metric its
panels name is one a service exports (read from a scrape's HELP and TYPE lines, so a
renamed figure fails here), and every figure of docs/metrics.md section 5 has a panel."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from test_jobs_api import start_jobs

from paddlecloud.builder.app import create_app as create_builder
from paddlecloud.common.keys import CONFIG
from support import Scrape, make_config, scrape

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "paddlecloud" / "dashboards" / "paddlecloud.json"
METRIC = re.compile(r"\bpaddlecloud_[a-z0-9_]+\b")
# The platform's own figures (docs/metrics.md, section 5), and the HTTP ones web.py exports.
FIGURES = {
    "paddlecloud_jobs",
    "paddlecloud_jobs_acting",
    "paddlecloud_jobs_submitted_total",
    "paddlecloud_jobs_finished_total",
    "paddlecloud_job_pending_seconds_bucket",
    "paddlecloud_build_cache_hits_total",
    "paddlecloud_build_cache_misses_total",
    "paddlecloud_builds_finished_total",
    "paddlecloud_uploads_in_flight",
    "paddlecloud_uploaded_bytes_total",
    "paddlecloud_pfs_stored_bytes",
    "paddlecloud_http_requests_total",
    "paddlecloud_http_request_duration_seconds_bucket",
}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


async def test_every_metric_the_dashboard_names_is_one_the_services_export(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client)
    builder = await aiohttp_server(
        create_builder(make_config(tmp_path, builder={"work_dir": str(tmp_path / "builder")}))
    )
    gateway = jobs.client.app[CONFIG].gateway
    scrapes = [
        Scrape(await (await jobs.client.get("/metrics")).text()),
        await scrape(gateway.jobs_url),
        await scrape(gateway.pfs_url),
        await scrape(str(builder.make_url(""))),
    ]
    exported = set().union(*(s.names() for s in scrapes))
    assert FIGURES <= exported, FIGURES - exported

    named: set[str] = set()
    ids = set()
    for panel in panels(dashboard):
        assert panel["id"] not in ids and panel["title"] and panel["description"], panel
        ids.add(panel["id"])
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(METRIC.findall(target["expr"]))
            assert names, f"{panel['title']}: {target['expr']} names no metric"
            assert names <= exported, f"{panel['title']}: not exported: {sorted(names - exported)}"
            named |= names
    assert FIGURES <= named, f"no panel shows {sorted(FIGURES - named)}"
    (variable,) = dashboard["templating"]["list"]
    assert variable == {**variable, "name": "datasource", "type": "datasource", "query": "prometheus"}

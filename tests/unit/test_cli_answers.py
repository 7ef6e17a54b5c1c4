"""The SDK's typed answers, and the blocking Client made from AsyncClient's methods."""

from __future__ import annotations

import inspect
import io
import json

from paddlecloud.answers import DryRun, Entry, Job, LogEntry, Quota
from paddlecloud.client import AsyncClient, Client
from paddlecloud.output import render_data
from paddlecloud.paddlejob import log_text

JOB = {
    "name": "fit",
    "owner": "alice",
    "state": "RUNNING",
    "reason": "2 of 2 trainers running",
    "created_at": "2026-01-01T00:00:00Z",
    "finished_at": None,
    "spec": {"name": "fit", "trainers": 2, "env": {"A": "1"}},
    "workers": [{"name": "trainer-0", "role": "TRAINER", "index": 0, "restarts": 0, "devices": ["0"]}],
    "events": [{"time": "2026-01-01T00:00:01Z", "type": "state", "state": "RUNNING"}],
    "something_new": {"the server": "added it later"},
}


def test_a_job_is_typed_all_the_way_down() -> None:
    job = Job.from_dict(JOB)
    assert (job.name, job.state, job.started_at, job.final) == ("fit", "RUNNING", None, False)
    assert job.spec["trainers"] == 2
    [worker] = job.workers
    assert (worker.name, worker.index, worker.devices, worker.exit_code) == ("trainer-0", 0, ["0"], None)
    assert job.events[0].state == "RUNNING"
    assert Job.from_dict({"state": "KILLED"}).final


def test_an_answer_is_the_servers_object_as_sent_and_reads_as_one() -> None:
    job = Job.from_dict(JOB)
    assert job.to_dict() == JOB and list(job.to_dict()) == list(JOB)  # keys and their order
    assert job == JOB and job["something_new"] == JOB["something_new"]
    assert job.get("missing", "default") == "default" and "owner" in job and len(job) == len(JOB)
    assert job.workers[0] == JOB["workers"][0]
    # -o json prints the server's data byte for byte.
    assert render_data(job, "json") == render_data(JOB, "json")
    assert render_data({"jobs": [job]}, "yaml") == render_data({"jobs": [JOB]}, "yaml")
    job.to_dict()["name"] = "changed"
    assert job["name"] == "fit"


def test_fields_of_the_wrong_type_or_missing_are_none_or_empty() -> None:
    entry = Entry.from_dict({"path": "/pfs/dc1/home/a/x", "size": "12", "type": "file"})
    assert (entry.size, entry.type, entry.sha256) == (None, "file", None)
    job = Job.from_dict({"workers": "no", "events": [1, {"type": "state"}], "spec": None})
    assert (job.workers, len(job.events), job.spec, job.name) == ([], 1, {}, None)
    assert Entry.from_dict({"size": True}).size is None  # a bool is not a size


def test_quota_and_dry_run() -> None:
    quota = Quota.from_dict(
        {"user": "a", "cpu": {"used": "1", "limit": None}, "gpu": {"used": 0, "limit": 2}}
    )
    assert list(quota.limits()) == ["cpu", "gpu"] and quota.gpu is not None and quota.gpu.limit == 2
    plan = DryRun.from_dict(
        {
            "dry_run": True,
            "job": {"name": "x"},
            "workers": [{"name": "trainer-0", "cpu": "1"}],
            "package": {"path": "/pfs/x", "kind": "tar", "found": False},
            "build": {"key": "k", "cached": True},
        }
    )
    assert plan.job is not None and plan.job.name == "x" and plan.workers[0].cpu == "1"
    assert plan.package is not None and plan.package.found is False
    assert plan.build is not None and plan.build.cached


def test_log_entries_show_as_the_text_stream_does() -> None:
    entry = LogEntry.from_dict({"worker": "trainer-0", "line": "hi", "cursor": "c1"})
    assert (
        entry.text == log_text(entry) == log_text({"worker": "trainer-0", "line": "hi"}) == "[trainer-0] hi"
    )
    assert json.dumps(entry.to_dict()) == '{"worker": "trainer-0", "line": "hi", "cursor": "c1"}'


def test_the_blocking_client_has_every_call_of_the_async_one_with_its_signature() -> None:
    skip = {"close", "open"}  # Client closes its own loop; open() yields a response to stream
    calls = [
        name
        for name, member in vars(AsyncClient).items()
        if not name.startswith("_")
        and name not in skip
        and (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member))
    ]
    assert "submit_package" in calls and "logs" in calls
    for name in calls:
        blocking = getattr(Client, name)
        assert not inspect.iscoroutinefunction(blocking), name
        assert inspect.signature(blocking) == inspect.signature(getattr(AsyncClient, name)), name
        assert blocking.__doc__ == getattr(AsyncClient, name).__doc__, name


def test_the_blocking_client_passes_its_options_on() -> None:
    log = io.StringIO()
    with Client("http://127.0.0.1:9", "alice", token="t", datacenter="dc1", log=log.write) as client:
        assert (client.aio.endpoint, client.aio.username, client.aio.datacenter) == (
            "http://127.0.0.1:9",
            "alice",
            "dc1",
        )
        assert client.token == "t"

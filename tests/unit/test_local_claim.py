"""A job directory is run by one supervisor, once: the claim a supervisor takes and the
look a restarted service takes at a job it recorded but never saw started."""

from __future__ import annotations

import os
from pathlib import Path

from paddlecloud.jobs.local import claim


def test_one_supervisor_claims_a_job_directory_and_none_after_it_ran(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    first = claim.claim(job_dir, job_dir)
    assert first is not None
    assert claim.claim(job_dir, job_dir) is None  # held
    assert claim.inspect(job_dir) is claim.Earlier.SUPERVISED
    (job_dir / "state.json").write_text("{}")
    os.close(first)  # the supervisor ended
    assert claim.claim(job_dir, job_dir) is None  # it ran here: never again
    assert claim.inspect(job_dir) is claim.Earlier.SUPERVISED
    assert not (job_dir / "abandoned").exists()


def test_a_half_made_directory_is_given_up_and_a_late_supervisor_runs_nothing(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "plan.json").write_text("{}")  # prepared; the supervisor was never forked
    assert claim.inspect(job_dir) is claim.Earlier.NOTHING
    assert (job_dir / "abandoned").exists()
    assert claim.claim(job_dir, job_dir) is None  # forked late: finds the mark
    assert claim.inspect(tmp_path / "never-made") is claim.Earlier.NOTHING


def test_a_supervisor_born_in_a_directory_since_replaced_claims_nothing(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    born_in = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(job_dir, tmp_path / "taken-away")
        job_dir.mkdir()  # the restarted service's fresh start of the job
        assert claim.claim(job_dir, f"/proc/self/fd/{born_in}") is None
        fresh = claim.claim(job_dir, job_dir)
        assert fresh is not None
        os.close(fresh)
    finally:
        os.close(born_in)

"""The CLI against `paddlecloud server` with its data, PFS root included, on CephFS (ceph-fuse).

The tree copy both ways (with skips of identical files) and resumes after an interrupted
transfer, taken whole from test_pfs_cli.py with their state on the session's CephFS mount;
and a local job whose trainers read their shards and write their output there.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_pfs_cli import (
    HOME,
    ok,
    run_cli,
    test_a_tree_goes_up_is_listed_is_skipped_when_identical_and_comes_back,
    test_interrupted_transfers_resume_without_resending,
)

pytestmark = pytest.mark.cephfs


@pytest.fixture
def tmp_path(cephfs_tmp_path: Path) -> Path:
    return cephfs_tmp_path


# Each trainer reads its share of the shards in the home (on CephFS, bind-mounted into its
# sandbox), and writes what it read into the home.
SHARDS_JOB = """\
import os
from paddlecloud import dataset

home = os.environ["PADDLE_CLOUD_PFS_HOME"]
samples = list(dataset.cluster_files_reader(os.path.join(home, "shards", "shard-*"))())
tid = os.environ["TRAINER_ID"]
os.makedirs(os.path.join(home, "out"), exist_ok=True)
with open(os.path.join(home, "out", f"trainer-{tid}.txt"), "w") as f:
    f.write(",".join(map(str, samples)))
    f.flush()
    os.fsync(f.fileno())
print("trainer", tid, "read", len(samples), "samples", "uid", os.getuid(), flush=True)
"""


def test_a_job_reads_its_shards_and_writes_its_output_on_cephfs(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory()
    shards = tmp_path / "shards"
    shards.mkdir()
    for number in range(4):
        with open(shards / f"shard-{number:04d}", "wb") as f:
            pickle.dump(list(range(number * 10, number * 10 + 10)), f)
    ok(run_cli(server, "cp", "-r", str(shards), "pfs:shards"))
    package = tmp_path / "job"
    package.mkdir()
    (package / "train.py").write_text(SHARDS_JOB)
    out = ok(run_cli(server, "submit", "-f", "--name", "shards", "--trainers", "2", str(package)))
    assert "[trainer-0] trainer 0 read 20 samples" in out, out
    assert "[trainer-1] trainer 1 read 20 samples" in out, out
    back = tmp_path / "back"
    ok(run_cli(server, "cp", "-r", f"{HOME}/out", str(back)))
    read = {name: (back / name).read_text() for name in sorted(os.listdir(back))}
    # Shards 0 and 2 for trainer 0, 1 and 3 for trainer 1: each sample read exactly once.
    assert read == {
        "trainer-0.txt": ",".join(map(str, [*range(0, 10), *range(20, 30)])),
        "trainer-1.txt": ",".join(map(str, [*range(10, 20), *range(30, 40)])),
    }
    sandboxed = shutil.which("bwrap") is not None
    if sandboxed and os.geteuid() == 0:
        # The home was given to the jobs' uid, on ceph-fuse as on a local disk.
        home = server.data_dir / "pfs" / "home" / "admin"
        assert home.stat().st_uid >= 200_000, home.stat()

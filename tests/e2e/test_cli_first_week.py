"""What a new user met in the CLI's first week (issue 28, item 6): logout, the order of a
finished job's logs, a role without workers, and the directories `cp` makes on PFS; against
one real `paddlecloud server`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import start_server
from test_jobs_cli import ok, one_error_line, run_cli, wait_for_state

pytestmark = pytest.mark.slow

HOME = "/pfs/datacenter1/home/admin"

# Two trainers take turns printing lines 0..5. Each waits for the other's turn file, and
# makes its own only once the supervisor has taken its line out of the pipe (FIONREAD says
# so): the lines reach the supervisor in the order 0, 1, 2 ... with no timing involved.
TURNS_PY = """\
import fcntl, os, struct, termios, time
tid = int(os.environ["TRAINER_ID"])
turns = os.path.join(os.environ["PADDLE_CLOUD_PFS_HOME"], os.environ["TURNS"])
os.makedirs(turns, exist_ok=True)
for k in range(tid, 6, 2):
    while k and not os.path.exists(os.path.join(turns, str(k))):
        time.sleep(0.005)
    print("line", k, "from trainer", tid, flush=True)
    while struct.unpack("i", fcntl.ioctl(1, termios.FIONREAD, b"0000"))[0]:
        time.sleep(0.005)
    open(os.path.join(turns, str(k + 1)), "w").close()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("first-week")
    started = start_server(root / "home", root / "data")
    yield started
    started.stop()


def test_logout_revokes_the_token_and_forgets_the_password(server: Any) -> None:
    server.cli("users", "create", "carol", "--password-stdin", stdin="carol-password\n")
    server.add_datacenter("as-carol", "carol", "carol-password")
    as_carol = ("--datacenter", "as-carol")
    ok(run_cli(server, *as_carol, "get", "jobs"))  # logged in by itself, with the config's password

    out = ok(run_cli(server, *as_carol, "logout"))
    assert "Logged out of as-carol" in out and "password is removed" in out, out
    config = (server.home / ".paddle" / "config").read_text()
    assert "carol-password" not in config and "username: carol" in config
    assert "as-carol" not in (server.home / ".paddle" / "tokens.json").read_text()
    # The next command needs a login: one line, the auth exit status, no silent login.
    line = one_error_line(run_cli(server, *as_carol, "get", "jobs"), code=4)
    assert "not logged in" in line and "paddlecloud login" in line, line
    # login without a terminal asks for --password-stdin, and with it logs in and keeps it.
    line = one_error_line(server.cli(*as_carol, "login", stdin="", check=False), code=2)
    assert "--password-stdin" in line, line
    result = server.cli(*as_carol, "login", "--password-stdin", stdin="carol-password\n")
    assert "as carol" in result.stdout
    ok(run_cli(server, *as_carol, "get", "jobs"))
    # The admin's own entry was left alone.
    ok(run_cli(server, "get", "jobs"))


def test_a_finished_jobs_logs_come_in_the_order_they_were_written(server: Any, tmp_path: Path) -> None:
    package = tmp_path / "turns"
    package.mkdir()
    (package / "train.py").write_text(TURNS_PY)
    ok(run_cli(server, "submit", "--name", "turns", "--trainers", "2", "--env=TURNS=turns-1", str(package)))
    wait_for_state(server, "turns", ("SUCCEEDED",))
    expected = [f"[trainer-{k % 2}] line {k} from trainer {k % 2}" for k in range(6)]
    # Not grouped by worker (0, 2, 4, then 1, 3, 5): as they came, as a live follow shows them.
    assert ok(run_cli(server, "logs", "turns")).splitlines() == expected
    assert ok(run_cli(server, "logs", "-n", "2", "turns")).splitlines() == expected[2:]

    # A role the job has no worker of: said in one line, exit 0, as kubectl says "No
    # resources found" for a selector that matches nothing; and a follow does not wait.
    result = run_cli(server, "logs", "-f", "-role", "pserver", "turns")
    assert result.returncode == 0 and result.stdout == "", result
    assert result.stderr.strip() == "No parameter servers in job turns (it has -pservers 0): no logs to show."


def test_cp_into_missing_pfs_directories_says_which_it_made(server: Any, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("f\n")
    out = ok(run_cli(server, "cp", str(tmp_path / "f.txt"), "pfs:does/not/exist/"))
    made = [f"{HOME}/does", f"{HOME}/does/not", f"{HOME}/does/not/exist"]
    assert f"made missing directories on PFS: {', '.join(made)}" in out, out
    assert "3 directories created" in out, out
    # Into a directory that exists: nothing made, nothing said.
    out = ok(run_cli(server, "cp", str(tmp_path / "f.txt"), "pfs:does/"))
    assert "made missing" not in out and "created" not in out, out

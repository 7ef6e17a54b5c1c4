"""The pure parts of local isolation: bwrap's arguments, cgroup files on v1 and v2, GPUs, uids."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from paddlecloud.builder.local import loopback_ports
from paddlecloud.common.cgroups import Hierarchy, Limits
from paddlecloud.common.sandbox import HOSTNAME, Bind, Command, Sandbox, View, bwrap_args
from paddlecloud.common.seccomp import filter_program
from paddlecloud.jobs.local.gpus import GpuPool
from paddlecloud.jobs.local.uids import UidMap, UidsExhausted

SYSTEM = [("usr", None), ("etc", None), ("bin", "usr/bin"), ("lib", "usr/lib")]


def pairs(args: list[str], option: str) -> list[tuple[str, str]]:
    """(source, target) of every `option SOURCE TARGET` in `args`."""
    return [(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == option]


def made_dirs(args: list[str]) -> dict[str, str]:
    """directory -> mode for every `--perms MODE --dir DIR`."""
    return {
        args[i + 3]: args[i + 1] for i, a in enumerate(args[:-3]) if a == "--perms" and args[i + 2] == "--dir"
    }


def test_a_view_binds_the_system_read_only_and_only_what_it_lists() -> None:
    view = View(
        uid=200001,
        gid=200001,
        binds=(
            Bind("/data/pfs/home/alice", "/pfs/dc1/home/alice", writable=True),
            Bind("/data/pfs/public", "/pfs/dc1/public"),
        ),
        cwd="/job/work",
        tmp="/data/jobs/x/tmp/trainer-0",
    )
    args = bwrap_args(view, SYSTEM, ["/root/.pyenv/versions/3.11.7", "/srv/venv"])
    assert args[-3:] == ["--chdir", "/job/work", "--"]
    assert {"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"} <= set(args)
    assert "--unshare-net" not in args  # workers reach each other on loopback
    # A job's worker: stopped through its process group, which bwrap itself does not survive.
    unbound = bwrap_args(view, SYSTEM, ["/srv/venv"], die_with_parent=False)
    assert "--die-with-parent" not in unbound and "--unshare-pid" in unbound
    assert pairs(args, "--ro-bind")[:2] == [("/usr", "/usr"), ("/etc", "/etc")]
    assert ("usr/bin", "/bin") in pairs(args, "--symlink")
    assert pairs(args, "--bind") == [
        ("/data/jobs/x/tmp/trainer-0", "/tmp"),
        ("/data/pfs/home/alice", "/pfs/dc1/home/alice"),
    ]
    read_only = pairs(args, "--ro-bind")
    assert ("/data/pfs/public", "/pfs/dc1/public") in read_only
    assert ("/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7") in read_only
    # Nothing else of the host: no /root, /home, /var, /work or the data directory itself.
    targets = {t for _, t in read_only + pairs(args, "--bind")}
    assert targets == {
        "/usr",
        "/etc",
        "/tmp",
        "/pfs/dc1/home/alice",
        "/pfs/dc1/public",
        "/root/.pyenv/versions/3.11.7",
        "/srv/venv",
    }
    # Above the Python: traversable, not listable; above the user's binds: plain directories.
    dirs = made_dirs(args)
    assert dirs["/root"] == dirs["/root/.pyenv"] == dirs["/root/.pyenv/versions"] == "0711"
    assert dirs["/pfs"] == dirs["/pfs/dc1"] == dirs["/pfs/dc1/home"] == "0755"
    assert ["--proc", "/proc"] == args[args.index("--proc") : args.index("--proc") + 2]


def test_parents_are_made_before_their_binds_and_never_inside_a_read_only_one() -> None:
    view = View(uid=1, gid=1, binds=(Bind("/envs/abc", "/tmp/t/envs/abc"),), tmp="/x/tmp")
    args = bwrap_args(view, SYSTEM, ["/usr/local/python"])
    # /usr/local/python is inside /usr (already there); /tmp's parents are made in it.
    assert "/usr/local" not in made_dirs(args)
    assert made_dirs(args) == {"/tmp/t": "0755", "/tmp/t/envs": "0755"}
    order = [a for a in args if a.startswith("/tmp")]
    assert order.index("/tmp/t") < order.index("/tmp/t/envs/abc")


def bwrap_options(command: Command) -> list[str]:
    """The options a wrapped command gives bwrap through its `--args` descriptor."""
    arguments = int(command.argv[command.argv.index("--args") + 1])
    assert arguments in command.fds
    return os.pread(arguments, 1 << 20, 0).decode().split("\0")[:-1]


def test_wrap_drops_to_the_views_uid_with_no_capabilities_only_as_root() -> None:
    view = View(uid=200005, gid=200005)
    as_root = Sandbox("/usr/bin/bwrap", "/usr/bin/setpriv", root=True).wrap(view, ["python", "train.py"])
    try:
        # bwrap's own command line (its PID 1's, inside) names no host path: the options
        # it reads from a memory file do.
        assert as_root.argv == [
            "/usr/bin/bwrap",
            "--args",
            str(as_root.fds[0]),
            "--",
            "/usr/bin/setpriv",
            "--reuid=200005",
            "--regid=200005",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
            "python",
            "train.py",
        ]
        options = bwrap_options(as_root)
        assert options[-2:] == ["--seccomp", str(as_root.fds[1])]
        assert os.pread(as_root.fds[1], 1 << 20, 0) == filter_program()
    finally:
        as_root.close()
    as_user = Sandbox("/usr/bin/bwrap", None, root=False).wrap(view, ["python", "train.py"])
    as_user.close()
    assert as_user.argv[0] == "/usr/bin/bwrap" and "/usr/bin/setpriv" not in as_user.argv
    unboxed = Sandbox(None, None, root=True).wrap(view, ["python", "train.py"])
    assert (unboxed.argv, unboxed.fds) == (["python", "train.py"], ())


def fake_hierarchy(tmp_path: Path, version: int) -> Hierarchy:
    root = tmp_path / "cgroup"
    if version == 2:
        root.mkdir()
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (root / "cgroup.subtree_control").write_text("")
    else:
        for controller in ("memory", "cpu", "pids"):
            (root / controller).mkdir(parents=True)
    return Hierarchy(version, root, "paddlecloud")  # type: ignore[arg-type]


def test_v2_limits_are_written_and_controllers_enabled_down_the_path(tmp_path: Path) -> None:
    h = fake_hierarchy(tmp_path, 2)
    # Files a real cgroupfs would show in each new group.
    [group] = h.create("job1/trainer-0", Limits(memory_bytes=64 * 2**20, cpu_milli=1500, pids=100))
    assert group == h.root / "paddlecloud" / "job1" / "trainer-0"
    assert (group / "memory.max").read_text() == str(64 * 2**20)
    assert (group / "cpu.max").read_text() == "150000 100000"
    assert (group / "pids.max").read_text() == "100"
    for ancestor in (h.root, h.root / "paddlecloud", h.root / "paddlecloud" / "job1"):
        assert (ancestor / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    (group / "memory.peak").write_text(str(64 * 2**20))
    usage = h.usage("job1/trainer-0")
    assert (usage.oom_kills, usage.peak_bytes, usage.limit_bytes) == (1, 64 * 2**20, 64 * 2**20)


def test_v1_limits_go_to_each_controllers_own_group(tmp_path: Path) -> None:
    h = fake_hierarchy(tmp_path, 1)
    memory, cpu, pids = h.create("job1/pserver-0", Limits(memory_bytes=2**30, cpu_milli=500, pids=64))
    assert memory == h.root / "memory" / "paddlecloud" / "job1" / "pserver-0"
    assert (memory / "memory.limit_in_bytes").read_text() == str(2**30)
    assert (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "50000"
    assert (pids / "pids.max").read_text() == "64"
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert h.usage("job1/pserver-0").oom_kills == 0


def test_gpus_go_to_one_job_at_a_time_and_come_back() -> None:
    pool = GpuPool(["0", "1", "2"])
    assert pool.refusal(1, 4) == "the job asks for 4 GPUs (4 trainers x 1), and this machine has 3"
    assert pool.refusal(0, 8) is None
    assert GpuPool([]).refusal(1, 1) == "this machine has no GPUs for jobs, and the job asks for 1"
    first = pool.take("a", {"trainer-0": 1, "trainer-1": 1})
    assert first == {"trainer-0": ["0"], "trainer-1": ["1"]}
    assert pool.take("b", {"trainer-0": 2}) is None and pool.free() == ["2"]  # all or nothing
    assert pool.take("a", {"trainer-0": 1, "trainer-1": 1}) == first  # asking again changes nothing
    pool.release("a")
    assert pool.take("b", {"trainer-0": 2}) == {"trainer-0": ["0", "1"]}
    restarted = GpuPool(["0", "1", "2"])
    restarted.hold("b", {"trainer-0": ["0", "1"]})
    assert restarted.free() == ["2"]


def test_uids_are_one_per_user_stable_and_never_shared(tmp_path: Path) -> None:
    path = tmp_path / "uids.json"
    uids = UidMap(path, 200000, 3)
    assert uids.uid_for("alice") == 200000
    assert uids.uid_for("bob") == 200001
    assert uids.uid_for("alice") == 200000
    # Another process (another map on the same file) sees the same table.
    assert UidMap(path, 200000, 3).uid_for("bob") == 200001
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(UidMap(path, 200000, 3).uid_for("carol")))]
    threads += [threading.Thread(target=lambda: results.append(UidMap(path, 200000, 3).uid_for("carol")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200002, 200002]
    with pytest.raises(UidsExhausted):
        UidMap(path, 200000, 3).uid_for("dave")


def test_only_the_package_sources_on_the_loopback_are_forwarded_into_a_build() -> None:
    sources = [
        "http://127.0.0.1:8765/simple/",
        "https://localhost/wheels/",
        "http://[::1]:9000/",
        "http://127.0.0.2:8765/again/",
        "https://pypi.org/simple/",
        "http://10.0.0.5:3141/root/pypi/",
        "/srv/wheels",
        "file:///srv/wheels",
        "",
    ]
    assert loopback_ports(sources) == [443, 8765]


def test_the_sandboxs_host_name_is_bound_over_the_hosts_etc_hosts() -> None:
    view = View(uid=1, gid=1, cwd="/job/work")
    command = Sandbox("/usr/bin/bwrap", None, root=False).wrap(view, ["true"])
    try:
        options = bwrap_options(command)
    finally:
        command.close()
    read_only = pairs(options, "--ro-bind")
    (hosts,) = [source for source, target in read_only if target == "/etc/hosts"]
    # After /etc itself, or the host's file would cover it again.
    assert read_only.index(("/etc", "/etc")) < read_only.index((hosts, "/etc/hosts"))
    lines = Path(hosts).read_text().splitlines()
    assert lines[-2:] == [f"127.0.0.1\t{HOSTNAME}", f"::1\t{HOSTNAME}"]
    assert lines[:-2] == Path("/etc/hosts").read_text().splitlines()
    assert ["--hostname", HOSTNAME] == options[options.index("--hostname") :][:2]
    # Owned by this uid, not writable by others, in a directory no one else can enter.
    for path in (hosts, str(Path(hosts).parent)):
        info = os.lstat(path)
        assert info.st_uid == os.geteuid() and not info.st_mode & 0o022, path
    assert not os.lstat(Path(hosts).parent).st_mode & 0o077

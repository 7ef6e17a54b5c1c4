"""`make demo`: start the platform on this machine, use it through the CLI, stop it cleanly.

Everything lives under .demo/ in the repository (a private HOME and data directory), so
the demo never touches your own ~/.paddle/config or ~/.paddlecloud.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / ".demo"
HOME = DEMO / "home"
DATA = DEMO / "data"
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
ENV["HOME"] = str(HOME)
CLI = [sys.executable, "-m", "paddlecloud"]
EXAMPLE = ROOT / "examples" / "fit_a_line"


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def run(*args: str, stdin: str | None = None) -> str:
    """Run one `paddlecloud` command as a user would, showing it and what it printed."""
    print(f"$ paddlecloud {shlex.join(args)}", flush=True)
    # Output is shown as it comes (a followed job streams its logs), stderr merged in.
    with subprocess.Popen(
        [*CLI, *args],
        env=ENV,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(stdin or "")
        proc.stdin.close()
        lines = []
        for line in proc.stdout:
            lines.append(line)
            print("  " + line.rstrip("\n"), flush=True)
        returncode = proc.wait(timeout=180)
    if returncode != 0:
        raise SystemExit(f"demo: `paddlecloud {shlex.join(args)}` exited {returncode}")
    return "".join(lines)


def start_server() -> tuple[subprocess.Popen[str], str]:
    step("Start the platform: gateway, jobs, pfs and builder as supervised processes")
    print(f"$ paddlecloud server --data-dir {DATA.relative_to(ROOT)} --port 0", flush=True)
    server = subprocess.Popen(
        [*CLI, "server", "--data-dir", str(DATA), "--port", "0"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert server.stdout is not None
    endpoint = ""
    for line in server.stdout:
        print("  " + line.rstrip(), flush=True)
        if line.startswith("PaddleCloud is running at "):
            endpoint = line.split()[4]
        if line.startswith("Press Ctrl-C"):
            break
    if not endpoint:
        server.wait()
        raise SystemExit(f"demo: the server did not start (exit {server.returncode}); see {DATA}/logs")
    return server, endpoint


def stop_server(server: subprocess.Popen[str]) -> None:
    step("Stop the platform (SIGTERM, as Ctrl-C would)")
    children = psutil.Process(server.pid).children(recursive=True)
    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=60)
    _, alive = psutil.wait_procs(children, timeout=10)
    if code != 0 or alive:
        raise SystemExit(f"demo: server exited {code}; still running: {[p.pid for p in alive]}")
    print(f"  server exited {code}; all {len(children)} service processes are gone", flush=True)


def main() -> int:
    started = time.monotonic()
    shutil.rmtree(DEMO, ignore_errors=True)
    HOME.mkdir(parents=True)
    server, endpoint = start_server()
    try:
        step("Log in as the administrator the first run created")
        run("login")
        run("version")

        step("Create a user, and log in as that user")
        run("users", "create", "alice", "--password-stdin", stdin="alice-demo-password\n")
        run("users", "quota", "alice", "-cpu", "4", "-memory", "8Gi", "-jobs", "2")
        run(
            "config",
            "add",
            "alice",
            "--endpoint",
            endpoint,
            "--username",
            "alice",
            "--password-stdin",
            stdin="alice-demo-password\n",
        )
        run("config", "use", "alice")
        run("login")
        run("whoami")
        run("-o", "json", "version")

        step("Make the example data set and upload it to PFS")
        housing = DEMO / "housing"
        made = subprocess.run(
            [sys.executable, str(EXAMPLE / "make_data.py"), str(housing)],
            capture_output=True,
            text=True,
            check=True,
        )
        print(
            f"$ python examples/fit_a_line/make_data.py {housing.relative_to(ROOT)}\n  {made.stdout.strip()}"
        )
        run("cp", "-r", str(housing), "pfs:data/housing")
        run("ls", "-r", "pfs:")
        run("pfs", "usage")

        step("Upload again, into the same place (the slash: what housing holds): identical files are skipped")
        run("cp", "-r", f"{housing}/", "pfs:data/housing")

        step("Download a shard back; the bytes are the same")
        back = DEMO / "housing-00000.back.csv"
        run("cp", "pfs:data/housing/housing-00000.csv", str(back))
        if back.read_bytes() != (housing / "housing-00000.csv").read_bytes():
            raise SystemExit("demo: the downloaded shard differs from the one uploaded")
        print("  identical to the original", flush=True)

        step("Train fit_a_line: 2 parameter servers and 2 trainers, with the original command line")
        run(
            "submit",
            "-jobname", "fit-a-line",
            "-cpu", "1", "-gpu", "0", "-memory", "1Gi",
            "-parallelism", "2",
            "-pscpu", "1", "-pservers", "2", "-psmemory", "1Gi",
            "-passes", "10",
            "-entry", "python train.py",
            "--input", "data/housing",
            "--follow",
            str(EXAMPLE.relative_to(ROOT)),
        )  # fmt: skip
        run("get", "jobs", "-a")
        run("get", "workers", "fit-a-line")
        run("get", "quota")

        step("Fetch the trained model from the job's output directory")
        model_dir = DEMO / "model"
        run("cp", "-r", "pfs:jobs/fit-a-line/output/", str(model_dir))
        model = json.loads((model_dir / "model.json").read_text())
        print(f"  model.json: final loss {model['final_loss']:.4f}", flush=True)

        step("Submit the same package again: it is already on PFS, so nothing is uploaded")
        run(
            "submit",
            "--job-name",
            "fit-a-line-again",
            "--trainers",
            "1",
            "--dry-run",
            str(EXAMPLE.relative_to(ROOT)),
        )
        # Packages are named by their sha256 under the home, beside the data set.
        run("ls", "pfs:.paddlecloud/packages")

        step("A job whose package has a requirements.txt: its environment is built once, then reused")
        run("submit", "--job-name", "hello-requirements", "--follow", "examples/hello_requirements")
        run("submit", "--job-name", "hello-again", "--dry-run", "examples/hello_requirements")
    finally:
        stop_server(server)
    print(f"\ndemo finished in {time.monotonic() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

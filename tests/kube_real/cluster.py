"""A one-machine Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler as real processes, built from Kubernetes' own
modules by scripts/kube-control-plane.sh (docs/testing.md says which flags and why).

Every identity is a client certificate from a throwaway CA made with openssl in the
cluster's folder, as kubeadm and controller-runtime's envtest do: the admin is in
`system:masters`, the controller manager and the scheduler are the users their default
RBAC roles name, a node is `system:node:<name>` in `system:nodes` (so the Node authorizer
and NodeRestriction judge it), and `user()` makes any other user, with no rights until
RBAC grants some.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kube_real.client import KubeClient
from kube_real.kubelet import SimulatedKubelet

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "kube-control-plane.sh"
STARTUP_TIMEOUT = 120.0
# Service ClusterIPs come from here; nothing routes to them on this machine.
SERVICE_CIDR = "10.96.0.0/16"
# Not in the API server's default set, and the one the chart's owner references need
# (`blockOwnerDeletion` asks for update on the owner's finalizers). The rest of the
# defaults (NamespaceLifecycle, LimitRanger, ServiceAccount, PodSecurity, ResourceQuota,
# the admission webhooks and ValidatingAdmissionPolicy, ...) are on without naming them.
EXTRA_ADMISSION = "NodeRestriction,OwnerReferencesPermissionEnforcement"


def bin_dir() -> Path:
    """Where the build script puts (or has put) the binaries."""
    out = subprocess.run([str(SCRIPT), "bin-dir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def kube_version() -> str:
    """The one pinned Kubernetes version, as the build script has it."""
    out = subprocess.run([str(SCRIPT), "version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def build() -> Path:
    """The binaries, built on first use (tens of minutes cold, nothing when cached)."""
    out = subprocess.run([str(SCRIPT), "build"], stdout=subprocess.PIPE, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # A killed test run must not leave an API server behind: PR_SET_PDEATHSIG.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


@dataclass(frozen=True)
class Identity:
    """A client certificate and its key, and the kubeconfig that uses them."""

    cert: Path
    key: Path
    kubeconfig: Path


@dataclass
class Pki:
    """A CA and the certificates it signs, in one folder."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    def make_ca(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(self.ca_key), "-out", str(self.ca_cert), "-days", "30",
            "-subj", "/CN=paddlecloud-test-ca",
        )  # fmt: skip

    def issue(self, name: str, subject: str, *, server: bool = False) -> tuple[Path, Path]:
        """A certificate for `subject` (`/O=group/CN=user`), for a server on loopback or a client."""
        cert, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        usage = "serverAuth" if server else "clientAuth"
        extensions = ["-addext", f"extendedKeyUsage={usage}", "-addext", "basicConstraints=CA:FALSE"]
        if server:
            extensions += ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
        self._openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "30", "-subj", subject,
            "-CA", str(self.ca_cert), "-CAkey", str(self.ca_key), *extensions,
        )  # fmt: skip
        return cert, key

    def signing_key(self) -> tuple[Path, Path]:
        """The service-account token signing key pair (private, public)."""
        key, pub = self.root / "sa.key", self.root / "sa.pub"
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key))
        self._openssl("ec", "-in", str(key), "-pubout", "-out", str(pub))
        return key, pub


@dataclass
class Cluster:
    """A running control plane. `admin` may do anything; `node_client(name)` and
    `user(name)` give other identities."""

    root: Path
    bins: Path
    server: str = ""
    pki: Pki = field(init=False)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    admin: KubeClient = field(init=False)
    # The admin's kubeconfig (its client certificate), for Helm and other clients.
    admin_kubeconfig: Path = field(init=False)

    def __post_init__(self) -> None:
        self.pki = Pki(self.root / "pki")

    @property
    def version(self) -> str:
        return kube_version()

    # -- identities ------------------------------------------------------------------
    def write_kubeconfig(
        self, path: Path, user: str, credentials: dict[str, str], namespace: str = ""
    ) -> Path:
        """A kubeconfig at `path` for this API server and its CA, as `user` with
        `credentials` (a client certificate and key, or a token), in `namespace` if given."""
        context = {"cluster": "local", "user": user} | ({"namespace": namespace} if namespace else {})
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.server, "certificate-authority": str(self.pki.ca_cert)},
                }
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": "local", "context": context}],
            "current-context": "local",
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    def identity(self, name: str, user: str, groups: Sequence[str] = ()) -> Identity:
        """A client certificate for `user` in `groups`, and a kubeconfig for it."""
        subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
        cert, key = self.pki.issue(name, subject)
        kubeconfig = self.write_kubeconfig(
            self.root / f"{name}.kubeconfig", user, {"client-certificate": str(cert), "client-key": str(key)}
        )
        return Identity(cert, key, kubeconfig)

    def client(self, identity: Identity) -> KubeClient:
        return KubeClient(self.server, self.pki.ca_cert, cert=(identity.cert, identity.key))

    def user(self, name: str, groups: Sequence[str] = ()) -> KubeClient:
        """A client for a user that has only the rights RBAC gives `name` or `groups`."""
        return self.client(self.identity(f"user-{name}", name, groups))

    def service_account(self, namespace: str, name: str) -> KubeClient:
        """A client with a token of ServiceAccount `namespace/name` (TokenRequest, signed
        by the API server's service-account key, as a pod's projected token is)."""
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        token = self.admin.create(path, request)["status"]["token"]
        return KubeClient(self.server, self.pki.ca_cert, token=token)

    def node_client(self, node: str) -> KubeClient:
        """A client that is the kubelet of `node`, as the Node authorizer knows it."""
        return self.client(self.identity(f"node-{node}", f"system:node:{node}", ["system:nodes"]))

    def kubelet(self, node: str, **capacity: Any) -> SimulatedKubelet:
        """A simulated kubelet for `node` (not started), serving logs to this API server."""
        cert, key = self.pki.issue(f"kubelet-{node}", f"/O=system:nodes/CN=system:node:{node}", server=True)
        return SimulatedKubelet(
            self.node_client(node), node, serving=(cert, key, self.pki.ca_cert), **capacity
        )

    # -- processes -------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        log.close()

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                tail = self.log_tail(name)
                raise RuntimeError(f"{name} exited {proc.returncode}:\n{tail}")

    def _wait_until(self, what: str, ready: Callable[[], bool], timeout: float = STARTUP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError):
                if ready():
                    return
            time.sleep(0.2)  # a process starting up: nothing to watch yet
        raise TimeoutError(f"{what} not ready in {timeout:.0f} s")

    def start(self) -> None:
        """etcd, then the API server (until /readyz), then the controller manager and the
        scheduler (until each holds its place: the first ServiceAccount made, the
        scheduler's /readyz)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.pki.make_ca()
        serving_cert, serving_key = self.pki.issue("apiserver", "/CN=kube-apiserver", server=True)
        kubelet_cert, kubelet_key = self.pki.issue(
            "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client"
        )
        sa_key, sa_pub = self.pki.signing_key()
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                str(self.bins / "etcd"),
                "--name=default",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                # Throwaway data on a shared test machine: no fsync per write (etcd's flag
                # for testing and development).
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(self.bins / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--tls-cert-file={serving_cert}",
                f"--tls-private-key-file={serving_key}",
                f"--client-ca-file={self.pki.ca_cert}",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={EXTRA_ADMISSION}",
                f"--service-account-issuer={self.server}",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--kubelet-client-certificate={kubelet_cert}",
                f"--kubelet-client-key={kubelet_key}",
                f"--kubelet-certificate-authority={self.pki.ca_cert}",
                "--kubelet-preferred-address-types=InternalIP",
                # The `kubernetes` Service's Endpoints would list 127.0.0.1, which the API
                # server refuses for an endpoint (loopback); nothing here dials it.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )
        admin = self.identity("admin", "paddlecloud-admin", ["system:masters"])
        self.admin = self.client(admin)
        self.admin_kubeconfig = admin.kubeconfig
        self._wait_until("kube-apiserver", lambda: self.admin.request("GET", "/readyz").status == 200)
        kcm = self.identity("kube-controller-manager", "system:kube-controller-manager")
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bins / "kube-controller-manager"),
                f"--kubeconfig={kcm.kubeconfig}",
                f"--authentication-kubeconfig={kcm.kubeconfig}",
                f"--authorization-kubeconfig={kcm.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                # Each controller acts with its own ServiceAccount's rights, as kubeadm sets it.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                f"--cluster-signing-cert-file={self.pki.ca_cert}",
                f"--cluster-signing-key-file={self.pki.ca_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*",
            ],
        )
        sched = self.identity("kube-scheduler", "system:kube-scheduler")
        sched_port = free_port()
        self._spawn(
            "kube-scheduler",
            [
                str(self.bins / "kube-scheduler"),
                f"--kubeconfig={sched.kubeconfig}",
                f"--authentication-kubeconfig={sched.kubeconfig}",
                f"--authorization-kubeconfig={sched.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                "--leader-elect=false",
            ],
        )
        # The ServiceAccount controller makes `default` in every namespace; until it has,
        # the ServiceAccount admission plugin refuses pods there.
        self._wait_until(
            "kube-controller-manager",
            lambda: (
                self.admin.request("GET", "/api/v1/namespaces/default/serviceaccounts/default").status == 200
            ),
        )
        self._wait_until("kube-scheduler", lambda: self._scheduler_ready(sched_port))

    def _scheduler_ready(self, port: int) -> bool:
        # /readyz is open to anyone (system:public-info-viewer) on the scheduler too.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # its self-signed serving certificate
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM to each in the reverse order of starting, then SIGKILL after 10 s."""
        for name in reversed(list(self.processes)):
            proc = self.processes[name]
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.processes.clear()


def start(root: Path, bins: Path | None = None, attempts: int = 3) -> Cluster:
    """A started cluster in `root`; stopped again if it does not come up. The ports are
    chosen free and then bound by other processes, so another process (an outgoing
    connection's ephemeral port, on a busy machine) can take one in between: then the
    cluster starts again, in a fresh directory, on other ports."""
    for attempt in range(attempts):
        cluster = Cluster(root=root / f"try-{attempt}" if attempt else root, bins=bins or build())
        try:
            cluster.start()
            return cluster
        except RuntimeError as exc:
            cluster.stop()
            if "address already in use" not in str(exc) or attempt == attempts - 1:
                raise
        except BaseException:
            cluster.stop()
            raise
    raise AssertionError("unreachable")


__all__ = ["Cluster", "Identity", "bin_dir", "build", "start"]

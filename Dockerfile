# The platform image: every service (gateway, jobs, pfs, builder) from one image, the
# service chosen by the command (`python -m paddlecloud.<service> --config FILE`, as the
# Helm chart runs it). Build: `make images` (docs/install.md).

# The base: a mirror of it for an air-gapped registry (`make images PYTHON_IMAGE=...`).
ARG PYTHON_IMAGE=python:3.11-slim

# --- build: the wheel and its dependencies into a virtualenv --------------------------
FROM ${PYTHON_IMAGE} AS build
# pip's index: a mirror where PyPI is out of reach (`make images PIP_INDEX_URL=...`).
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cli ./cli
COPY services ./services
# The venv's own pip (the base's ensurepip) is new enough to build the wheel: not upgraded,
# so the build fetches the project's dependencies and nothing else.
RUN python -m venv /opt/paddlecloud \
    && /opt/paddlecloud/bin/pip install .

# --- run: the virtualenv on a slim Python, as an unprivileged user ---------------------
FROM ${PYTHON_IMAGE}
# uid/gid 1000: the chart's runAsUser/runAsGroup, which PFS files and job pods share.
# Written with the shell alone (no useradd), so any base with a /bin/sh will do.
RUN echo 'paddlecloud:x:1000:' >> /etc/group \
    && echo 'paddlecloud:x:1000:1000::/tmp:/usr/sbin/nologin' >> /etc/passwd
COPY --from=build /opt/paddlecloud /opt/paddlecloud
ENV PATH=/opt/paddlecloud/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 1000:1000
WORKDIR /tmp
# The gateway by default; the chart names each service's command.
CMD ["python", "-m", "paddlecloud.gateway", "--config", "/etc/paddlecloud/paddlecloud.yaml"]

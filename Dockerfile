# The platform image: every service (gateway, jobs, pfs, builder) from one image, the
# service chosen by the command (`python -m paddlecloud.<service> --config FILE`, as the
# Helm chart runs it). Build: `make images` (docs/install.md).

# --- build: the wheel and its dependencies into a virtualenv --------------------------
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cli ./cli
COPY services ./services
RUN python -m venv /opt/paddlecloud \
    && /opt/paddlecloud/bin/pip install --upgrade pip \
    && /opt/paddlecloud/bin/pip install .

# --- run: the virtualenv on a slim Python, as an unprivileged user ---------------------
FROM python:3.11-slim
# uid/gid 1000: the chart's runAsUser/runAsGroup, which PFS files and job pods share.
RUN groupadd --gid 1000 paddlecloud \
    && useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin paddlecloud
COPY --from=build /opt/paddlecloud /opt/paddlecloud
ENV PATH=/opt/paddlecloud/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 1000:1000
WORKDIR /tmp
# The gateway by default; the chart names each service's command.
CMD ["python", "-m", "paddlecloud.gateway", "--config", "/etc/paddlecloud/paddlecloud.yaml"]

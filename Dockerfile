# syntax=docker/dockerfile:1
# The project image: `joblease operator` (the chart's Deployment), the CLI and
# `joblease run`; the sidecar has its own image (sidecar-go/Dockerfile). Non-root, no build tools,
# read-only root filesystem friendly (writes only to /tmp).
#
# The base is pinned by tag and digest (the multi-arch index of
# python:3.11.10-slim-bookworm); refresh both together, e.g. with
#   docker buildx imagetools inspect python:3.11.10-slim-bookworm
ARG PYTHON_IMAGE=python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16

# ---------------------------------------------------------------- builder
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/joblease
COPY pyproject.toml README.md ./
COPY operator/ operator/
# A regular (non-editable) install of the package, the operator extra (kopf) and
# the otel extra (so `joblease run` in this image exports its tenure spans when
# the OTEL_* variables ask for it; nothing imports it otherwise: docs/tracing.md).
# pip and setuptools are build tools: they leave the venv before it is copied
# (nothing installs at run time).
RUN /opt/joblease/bin/pip install --no-compile ".[operator,otel]" \
 && /opt/joblease/bin/python -m pip uninstall --yes --quiet pip setuptools \
 && /opt/joblease/bin/python -m compileall -q /opt/joblease/lib \
 && /opt/joblease/bin/joblease --help >/dev/null

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="joblease" \
      org.opencontainers.image.description="Job leases with fencing tokens on etcd: operator and sidecar" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/joblease/joblease" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11.10-slim-bookworm"
ENV PATH=/opt/joblease/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
COPY --from=builder /opt/joblease /opt/joblease
# 65532: the conventional "nonroot" id; numeric so that runAsNonRoot can verify it.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["joblease"]
CMD ["--help"]

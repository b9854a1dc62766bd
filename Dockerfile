# The image the Kubernetes example runs (examples/k8s/serve.yaml, compute.executor: k8s): the pipeline, its steps and `rl-assets serve`.
#
#   GPU (default): docker build -t rl-assets:1 .
#   CPU variant:   docker build -t rl-assets:1-cpu --build-arg BASE=debian:bookworm-slim \
#                    --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu --build-arg EXTRAS=serve,k8s,mlflow .
#
# Python 3.11 (the interpreter requirements.lock was resolved on) comes from uv on both bases, so the pins hold on each.
ARG BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ghcr.io/astral-sh/uv:0.9.5 AS uv

FROM ${BASE}
# torch is pinned like the Makefile's TORCH; the CUDA wheels come from PyPI, the CPU ones from PyTorch's CPU index.
ARG TORCH=torch==2.13.0
ARG TORCH_INDEX=https://pypi.org/simple
# vllm is the GPU rollout engine and `vllm serve models/promoted`; the CPU variant leaves it out.
ARG EXTRAS=serve,k8s,vllm,mlflow
ENV PYTHONUNBUFFERED=1 \
    UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_NO_CACHE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    DAGSTER_HOME=/workspace/.dagster \
    HF_HOME=/workspace/.cache/huggingface

# git: lineage cards record the code version; bubblewrap: the code_execution reward's sandbox. The versions are the base's own
# (two bases, two distributions): the image is reproducible through its base tag and the lock files.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates git bubblewrap \
    && rm -rf /var/lib/apt/lists/*

COPY --from=uv /uv /usr/local/bin/uv
RUN uv python install 3.11 && uv venv /opt/venv --python 3.11

WORKDIR /opt/rl-assets
# Dependencies first (a layer that survives code edits), then the code itself.
COPY pyproject.toml requirements.lock README.md ./
RUN uv pip install --index-url "${TORCH_INDEX}" "${TORCH}" \
    && mkdir rl_assets pipelines && touch rl_assets/__init__.py pipelines/__init__.py \
    && uv pip install -c requirements.lock ".[${EXTRAS}]" \
    && rm -rf rl_assets pipelines
COPY rl_assets rl_assets
COPY pipelines pipelines
COPY dagster.yaml workspace.yaml params.yaml ./
RUN uv pip install --no-deps -e .

# A non-root user; the project (data/, models/, .dagster/) lives on the volume mounted at /workspace.
RUN useradd --uid 1000 --create-home --shell /bin/bash rl \
    && mkdir -p /workspace && cp dagster.yaml workspace.yaml params.yaml /workspace/ && chown -R rl:rl /workspace
COPY --chown=1000:1000 data/raw /workspace/data/raw
USER 1000:1000
WORKDIR /workspace
EXPOSE 8000
CMD ["rl-assets", "serve", "--host", "0.0.0.0", "--port", "8000"]

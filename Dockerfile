# syntax=docker/dockerfile:1.7
# One image for every agentrl component (ingest, validate, train, evaluate, serve, ...),
# the Prefect workers and the MLflow server. vLLM is NOT in it: its pins conflict with
# ours; it runs from its own image (infra/base/vllm.yaml), reached over its OpenAI API.
#
#   docker build -t agentrl:0.1.0 .                                  # CPU (laptop, dev)
#   docker build -t agentrl:0.1.0-cu128 \
#     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .  # GPU nodes
#
# The source lives at /app in both stages and the project is installed in editable mode:
# components resolve shipped files relative to the repository root (configs/deepspeed,
# infra/prefect), so the root must exist in the image as it does in a checkout.

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Dependencies first (a cached layer until a lock changes), then the project itself.
COPY requirements.lock pyproject.toml README.md ./
COPY infra/requirements-cluster.lock ./infra/
# The lock pins the CPU torch wheel; GPU images point TORCH_INDEX at a CUDA index.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --extra-index-url ${TORCH_INDEX} -r requirements.lock \
 && pip install -c requirements.lock -r infra/requirements-cluster.lock
COPY components ./components
COPY flows ./flows
RUN pip install --no-deps -e . \
 && find /opt/venv -name '__pycache__' -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE} AS runtime
# bubblewrap: the sandbox's read-only host + private namespaces; git: DVC needs it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap git \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 --user-group agentrl
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
COPY configs /app/configs
COPY infra/prefect /app/infra/prefect
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1 HOME=/home/agentrl
WORKDIR /workspace
RUN chown agentrl:agentrl /workspace
USER 10001
ENTRYPOINT ["agentrl"]
CMD ["--help"]

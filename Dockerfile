# syntax=docker/dockerfile:1.7
# One image for every agentrl component (ingest, validate, train, sample, evaluate, ...).
# vLLM is NOT in this image: its pins conflict with ours; it runs from its own image and is
# reached over its OpenAI-compatible API.

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# Dependencies first (cached layer), then the project itself.
COPY requirements.lock pyproject.toml README.md ./
# The lock pins the CPU torch wheel (+cpu); GPU images override TORCH_INDEX to a CUDA index.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --extra-index-url ${TORCH_INDEX} -r requirements.lock
COPY components ./components
COPY flows ./flows
RUN pip install --no-deps .

FROM ${PYTHON_IMAGE} AS runtime
# bubblewrap: the sandbox's read-only host + private namespaces; git: DVC needs it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap git \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 agentrl
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
WORKDIR /workspace
COPY --chown=agentrl:agentrl configs ./configs
USER 10001
ENTRYPOINT ["agentrl"]
CMD ["--help"]

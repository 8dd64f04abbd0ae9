#!/usr/bin/env bash
# Run the gpu tier (tests/gpu, `-m gpu`) on a CUDA machine whose plain python has torch,
# transformers, tokenizers, numpy and pytest but not the project's venv (no trl, prefect,
# mlflow, pytest-timeout, pytest-asyncio ...). Run from anywhere inside the repository:
#
#   bash tests/gpu/run_on_device.sh [extra pytest args]
#
# - PYTHONPATH=. : the project is not installed there; `components` is imported from the tree.
# - -o addopts="" : pyproject's addopts say `-m 'not ... gpu'` (ours overrides it anyway) and
#   may name plugins that are missing there; markers and testpaths still come from pyproject.
# - -W ignore::pytest.PytestConfigWarning : pyproject's `timeout` / `asyncio_*` options are
#   unknown without those plugins; a warning, not an error.
# - conftest files: only tests/conftest.py is on the way to tests/gpu, and it needs nothing
#   but pytest (torch only when a gpu test is selected); its skip-without-CUDA logic is
#   still there, and the test file also skips its cuda cases itself without CUDA.
# - A CUDA device is required: the tier would otherwise "pass" with every test skipped.
#   ALLOW_NO_CUDA=1 runs anyway (a check of this script on a CPU machine). PYTHON picks the
#   interpreter (default python3).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PYTHON="${PYTHON:-python3}"
export PYTHONPATH=".${PYTHONPATH:+:${PYTHONPATH}}"
export PYTHONDONTWRITEBYTECODE=1

"$PYTHON" - <<'EOF' || [ "${ALLOW_NO_CUDA:-0}" = 1 ]
import sys

import torch
import transformers

cuda = torch.cuda.is_available()
name = torch.cuda.get_device_name(0) if cuda else "none"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"transformers {transformers.__version__}, device: {name}")
if not cuda:
    print("no CUDA device: the gpu tier would only skip (ALLOW_NO_CUDA=1 to run anyway)")
    sys.exit(3)
EOF

exec "$PYTHON" -m pytest tests/gpu -m gpu -q -p no:cacheprovider \
    --rootdir . -o addopts="" -W ignore::pytest.PytestConfigWarning -rs "$@"

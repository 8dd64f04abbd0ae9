#!/usr/bin/env bash
# GPU check for one offline CUDA machine, as it is: its own python (3.12, CUDA torch,
# transformers, peft, accelerate), no DeepSpeed, no vLLM, no network, this working tree
# (< 64 MiB) and nothing else. Within 8 minutes: SFT, LoRA SFT and one GRPO iteration on the
# GPU (configs/gpu-single.yaml's settings on a small model built there), printing tokens/s,
# peak GPU memory and the log-prob agreement between sampling and training; legs whose
# engine is absent are skipped with a line that says so. Exits non-zero on any failure.
#
#   scripts/gpu_check.sh [OUT_DIR]                 (default runs/gpu_check)
#   scripts/gpu_check.sh --wheelhouse DIR          (here, with network: fetch the wheels)
#
# - Nothing is installed on the machine. A venv in OUT_DIR (--system-site-packages, no pip)
#   sees the machine's packages; if the machine lacks pytest or pytest-timeout (the
#   verifier runs the tasks' tests with this interpreter), their pure-Python wheels are
#   unpacked into that venv from WHEELHOUSE (default .gpu-wheels: carry it with the tree,
#   ~1 MiB; only wheels tagged none-any are used). No venv module: the machine's python is
#   used as is.
# - PYTHON picks the interpreter (default python3). ALLOW_CPU=1 runs the same legs at a tiny
#   size on the CPU when there is no CUDA device (a check of this script:
#   tests/gpu/test_gpu_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ "${1:-}" = "--wheelhouse" ]; then
  # Versions from requirements.lock; pure-Python wheels only.
  dir=${2:?usage: scripts/gpu_check.sh --wheelhouse DIR}
  mkdir -p "$dir"
  for name in pytest pytest-timeout pluggy iniconfig packaging; do
    pin=$(grep -i "^${name}==" requirements.lock)
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --dest "$dir" "$pin"
  done
  ls -l "$dir"
  exit 0
fi

OUT=${1:-runs/gpu_check}
WHEELHOUSE=${WHEELHOUSE:-.gpu-wheels}
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
rm -rf "$OUT" && mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the project, from this tree
export PYTHONDONTWRITEBYTECODE=1 TOKENIZERS_PARALLELISM=false

# The venv must see what the machine's python sees (a python that is itself a venv would
# not pass its packages on): else the machine's python is used as is.
if "$PYTHON" -m venv --system-site-packages --without-pip "$OUT/venv" >/dev/null 2>&1 \
  && "$OUT/venv/bin/python" -c "import torch, transformers" 2>/dev/null; then
  PY="$OUT/venv/bin/python"
else
  PY="$PYTHON"
  stamp "note: no usable venv here; $PYTHON is used as is (carried wheels go to $OUT/site)"
fi
stamp "interpreter: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"

absent=$("$PY" scripts/gpu_check.py --missing)
stamp "absent modules: ${absent:-none}"
if [ -n "$absent" ] && [ -d "$WHEELHOUSE" ]; then
  if [ "$PY" = "$PYTHON" ]; then
    "$PY" scripts/gpu_check.py --carry "$WHEELHOUSE" --site "$OUT/site"
    export PYTHONPATH="$PYTHONPATH:$PWD/$OUT/site"
  else
    "$PY" scripts/gpu_check.py --carry "$WHEELHOUSE"
  fi
fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
cpu=()
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  if [ "${ALLOW_CPU:-0}" != 1 ]; then
    echo "gpu_check: torch sees no CUDA device (ALLOW_CPU=1 runs the legs tiny on the CPU)"
    exit 3
  fi
  stamp "no CUDA device: tiny legs on the CPU (ALLOW_CPU=1)"
  cpu=(--cpu)
fi
"$PY" scripts/gpu_check.py --out "$OUT" "${cpu[@]}"
stamp "gpu_check done"

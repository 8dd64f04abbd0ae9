#!/usr/bin/env bash
# GPU check, for a machine with one CUDA GPU (budget: < 8 minutes on an H200, cold venv):
#   1. the venv from the Makefile (pinned lock), with a CUDA build of the pinned torch;
#   2. CUDA visible to torch;
#   3. a tiny SFT through DeepSpeed ZeRO-2 on 1 GPU, launched by torch.distributed.run;
#   4. one GRPO iteration (sample -> verify in the sandbox -> update) from that policy.
# Prints timings and tokens/s; exits non-zero on the first failure.
#   scripts/gpu_check.sh [OUT_DIR]      (TORCH_CUDA_INDEX overrides the CUDA wheel index)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu_check}
PY=.venv/bin/python
rm -rf "$OUT" && mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

stamp "venv (make install)"
make install

# The lock pins the CPU wheel of torch (laptops); a GPU machine needs the CUDA build of
# the same version. Without a reachable index this fails here, clearly.
if ! $PY -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)"; then
  version=$($PY -c "import torch; print(torch.__version__.split('+')[0])")
  index=${TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu128}
  stamp "installing torch==$version from $index"
  $PY -m pip install -q --disable-pip-version-check --index-url "$index" "torch==$version"
fi

stamp "CUDA"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY - <<'PY'
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
print(f"torch {torch.__version__} cuda {torch.version.cuda} on {torch.cuda.get_device_name(0)}, "
      f"bf16 {torch.cuda.is_bf16_supported()}")
PY

stamp "tasks + expert trajectories (oracle, sandboxed)"
$PY -m components.cli tasks generate --out "$OUT/tasks" --n 24 --seed 0 --workers 4
$PY -m components.cli env eval --tasks "$OUT/tasks" --policy oracle --split train \
  --out "$OUT/oracle.json" --trajectories-out "$OUT/expert.jsonl" --workers 4 --quiet

cat > "$OUT/policy.json" <<'JSON'
{"num_layers": 2, "hidden_size": 256, "num_heads": 4, "seed": 0}
JSON
cat > "$OUT/sft.json" <<JSON
{"max_steps": 30, "batch_size": 4, "grad_accum": 2, "learning_rate": 1e-3,
 "max_seq_len": 1024, "lr_scheduler": "constant", "bf16": true,
 "output_dir": "$OUT/sft", "deepspeed": {"zero_stage": 2}}
JSON

stamp "SFT: DeepSpeed ZeRO-2, 1 GPU, torch.distributed.run"
s0=$(date +%s)
DS_BUILD_OPS=0 $PY -m torch.distributed.run --standalone --nproc_per_node 1 \
  -m components.train.deepspeed_launch --records "$OUT/expert.jsonl" \
  --policy-config "$OUT/policy.json" --sft-config "$OUT/sft.json" --result "$OUT/sft.result.json"
$PY - "$OUT/sft.result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["metrics"]["zero_stage"] == 2 and r["steps"] == 30, r["metrics"]
assert r["losses"][-1] < r["losses"][0], f"loss did not fall: {r['losses'][0]} -> {r['losses'][-1]}"
print(f"SFT: {r['steps']} steps, loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}, "
      f"{r['tokens']} tokens in {r['train_seconds']:.1f} s = {r['tokens_per_second']:.0f} tokens/s")
PY
stamp "SFT done in $(($(date +%s) - s0)) s"

stamp "GRPO: one iteration from the SFT policy"
g0=$(date +%s)
$PY -c "import sys; from components.train.grpo import main_grpo; sys.exit(main_grpo(sys.argv[1:]))" \
  --policy "$OUT/sft/policy" --tasks "$OUT/tasks" --split train --out "$OUT/grpo" \
  --iterations 1 --tasks-per-iteration 4 --group-size 4 --max-new-tokens 64 --max-steps 4 \
  --workers 4 --no-resume | tee "$OUT/grpo.out.json"
$PY - "$OUT/grpo/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
assert len(rows) == 1, f"expected one iteration, got {len(rows)}"
row = rows[0]
shown = {k: row[k] for k in sorted(row) if any(s in k for s in ("second", "token", "reward", "loss"))}
print("GRPO iteration:", json.dumps(shown, indent=1))
PY
stamp "GRPO done in $(($(date +%s) - g0)) s"
stamp "gpu_check passed"

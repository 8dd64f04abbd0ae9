#!/usr/bin/env bash
# `make run` (install included) in a fresh clone of this checkout's HEAD while every core is
# kept busy by a burner process: the pipeline must start and finish on a loaded machine
# (issue 32). Prints the exit status, the wall time, the stage timings and the candidate's
# fingerprints (weights sha256, evaluation digest), which a quiet run of the same commit and
# preset must match (docs/reproducibility.md).
#
#     scripts/busy_make_run.sh [CLONE_DIR]      (default: a new temporary folder)
set -uo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dest=${1:-$(mktemp -d)/agentrl}
git clone -q "$root" "$dest" || exit 2
burners=()
for _ in $(seq "$(nproc)"); do
    python3 -c 'while True: pass' &
    burners+=($!)
done
trap 'kill "${burners[@]}" 2>/dev/null' EXIT
start=$(date +%s)
(cd "$dest" && make run > make-run.log 2>&1)
rc=$?
wall=$(( $(date +%s) - start ))
echo "make run with ${#burners[@]} burners on $(nproc) cores: exit $rc in ${wall} s (install included)"
echo "commit $(git -C "$dest" rev-parse --short HEAD); log: $dest/make-run.log"
grep -A1 "=== Stage timings" "$dest/make-run.log" || tail -5 "$dest/make-run.log"
cat "$dest/runs/pipeline/fingerprints.json" 2>/dev/null && echo
exit "$rc"

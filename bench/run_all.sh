#!/usr/bin/env bash
# Run every host benchmark once; results go to bench/results/*.json and BENCHMARKS.md.
# Usage: bash bench/run_all.sh [python]   (default: .venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${1:-}"
if [[ -z "$PY" ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
"$PY" -c "import torch" 2>/dev/null || {
    echo "PyTorch is missing: pip install torch==2.13.0 (a CPU build; never an unpinned torch)" >&2
    exit 1
}
"$PY" bench/bench_accuracy.py --workload all   # W1 ~30 s, W3 ~2 min, W2 ~8 min
# Speed: W1 only so far (bench_speed.py has not been run on the W2/W3 twins yet).
for wl in w1; do
    "$PY" bench/bench_speed.py --workload "$wl"
done

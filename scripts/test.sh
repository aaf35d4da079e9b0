#!/usr/bin/env bash
# Runs the whole test suite; sets everything up first.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/bootstrap.sh"
cd "$here"
exec .venv/bin/python -m pytest -q --durations=25 "$@"

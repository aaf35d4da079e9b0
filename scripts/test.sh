#!/usr/bin/env bash
# Runs the whole test suite; sets everything up first.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/bootstrap.sh"
cd "$here"
# one pytest worker per core (pytest-xdist); TT_TEST_WORKERS=0 runs in this process
exec .venv/bin/python -m pytest -q --durations=25 -n "${TT_TEST_WORKERS:-auto}" "$@"

#!/usr/bin/env bash
# The project's main job: set up, then the whole pipeline on the W1 benchmark model.
# Each stage is a function; stages that are not written yet are listed (commented) in
# STAGES so the order of the pipeline is visible here:
#   bootstrap -> train -> eval -> codegen -> build -> emulate -> verify -> federate
# Usage: scripts/main-job.sh [stage ...]   (default: every enabled stage, in order)
# Environment: SEED (0), EPOCHS (20), RUNS (runs/) override the defaults.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

SEED="${SEED:-0}"
EPOCHS="${EPOCHS:-20}"
RUNS="${RUNS:-runs}"
MODEL=digits-mlp
DATA=digits
OUT="$RUNS/$MODEL.tt"
TT=".venv/bin/tinytrain"

log() { echo "[main-job] $*"; }

stage_bootstrap() {
  bash scripts/bootstrap.sh
}

stage_train() {
  mkdir -p "$RUNS"
  "$TT" train --data "$DATA" --model "$MODEL" --epochs "$EPOCHS" --seed "$SEED" \
    --out "$OUT" --plot "$RUNS/$MODEL.png" --json | tee "$RUNS/$MODEL.train.log" | tail -n 1 \
    > "$RUNS/$MODEL.train.json"
  log "train summary: $(cat "$RUNS/$MODEL.train.json")"
}

stage_eval() {
  "$TT" eval --model "$OUT" --data "$DATA" --json | tail -n 1 > "$RUNS/$MODEL.eval.json"
  log "eval: $(cat "$RUNS/$MODEL.eval.json")"
  "$TT" info "$OUT"
}

BOARD="${BOARD:-mps2_an386}"   # default emulated board (Cortex-M4 in QEMU)
STEPS="${STEPS:-300}"

stage_codegen() {
  # C for the trained model (its trained state is the firmware's initial state) + memory report
  "$TT" codegen --model "$OUT" --out "$RUNS/$MODEL-c" --board "$BOARD"
}

stage_build() {
  "$TT" build --model "$OUT" --board "$BOARD" --out "$RUNS/$MODEL-fw"
}

stage_verify() {
  # boots the firmware in QEMU, streams samples over the serial protocol, compares the device's
  # state hash with the simulator's after every step; exits non-zero on any mismatch
  "$TT" verify --model "$OUT" --board "$BOARD" --steps "$STEPS" --json | tee "$RUNS/$MODEL.verify.log" \
    | tail -n 1 > "$RUNS/$MODEL.verify.json"
  log "verify: $(cat "$RUNS/$MODEL.verify.json")"
  "$TT" verify --model "$OUT" --board host --steps 1000 --json | tail -n 1 > "$RUNS/$MODEL.verify-host.json"
  log "verify (host C via cffi): $(cat "$RUNS/$MODEL.verify-host.json")"
}

stage_federate() {
  if "$TT" federate --help >/dev/null 2>&1; then
    "$TT" federate --model "$MODEL" --board "$BOARD" --devices 4 --rounds 5 --partition dirichlet:0.5 --compress int8 --out "$RUNS/federated" --json \
      | tail -n 1 > "$RUNS/federated.json"
    log "federate: $(cat "$RUNS/federated.json")"
  else
    log "federate: not available in this version (see README, Known gaps)"
  fi
}

STAGES=(bootstrap train eval codegen build verify federate)

run_stages=("$@")
[ ${#run_stages[@]} -eq 0 ] && run_stages=("${STAGES[@]}")
for s in "${run_stages[@]}"; do
  if ! declare -F "stage_$s" >/dev/null; then
    echo "[main-job] unknown stage '$s': stages are ${STAGES[*]}" >&2
    exit 2
  fi
  log "== $s =="
  start=$(date +%s)
  "stage_$s"
  log "== $s done in $(( $(date +%s) - start ))s =="
done

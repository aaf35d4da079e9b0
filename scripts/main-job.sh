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

# Not yet written (each will read $OUT and write into $RUNS):
# stage_codegen()  { "$TT" codegen --model "$OUT" --out "$RUNS/$MODEL-c"; }
# stage_build()    { "$TT" build --project "$RUNS/$MODEL-c" --board mps2-an386; }
# stage_emulate()  { "$TT" emulate --project "$RUNS/$MODEL-c" --board mps2-an386; }
# stage_verify()   { "$TT" verify --model "$OUT" --board mps2-an386 --steps 100; }
# stage_federate() { "$TT" federate --model "$MODEL" --devices 4 --rounds 5; }

STAGES=(bootstrap train eval)  # + codegen build emulate verify federate when they exist

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

#!/usr/bin/env bash
# TensorBoard event files (Note [tensorboard events]) of real 2-rank runs, read by
# TensorBoard's own loader (tests/tensorboard_check.py, in the venv made by
# tests/tensorboard_venv.sh):
#   search   quickstart with batch.per_gpu=auto: every tag, with the steps and
#            values of metrics.jsonl, and the search's series those of search.json
#   resume   checkpoints every 20 steps, stopped at step 50 (train.max_steps), resumed
#            (--resume auto: the step-40 checkpoint) to the end: two event files, the second
#            opening with START at 41; TensorBoard's train/loss strictly increasing
#            over the whole run, steps 41..50 of the first run dropped for the resumed ones
# Fails, never skips, when the venv cannot be made.
#   tensorboard_check.sh MPIRUN "MPI_FLAGS" BIN SRC_DIR OUT SCENARIO
set -uo pipefail
MPIRUN=$1 MPI_FLAGS=$2 BIN=$3 SRC=$4 OUT=$5 SCENARIO=$6

fail() { echo "FAIL: $*" >&2; exit 1; }
run() {  # run NAME ARGS...: a 2-rank quickstart into OUT/NAME
  local name=$1; shift
  # shellcheck disable=SC2086
  $MPIRUN $MPI_FLAGS -np 2 "$BIN" "$SRC/configs/quickstart.yaml" --output "$OUT/$name" --quiet \
    "$@" > "$OUT/$name.log" 2>&1 || { cat "$OUT/$name.log"; fail "the run $name failed"; }
  if grep -a 'warning: TensorBoard' "$OUT/$name.log"; then fail "$name warned about its events"; fi
}

rm -rf "$OUT" && mkdir -p "$OUT" || fail "cannot create $OUT"
venv=$(bash "$SRC/tests/tensorboard_venv.sh") || fail "no TensorBoard venv (see above)"
check() { "$venv/bin/python" "$SRC/tests/tensorboard_check.py" "$@" || fail "TensorBoard's view of $1 (above)"; }

case $SCENARIO in
  search)
    run run --set batch.per_gpu=auto --set train.epochs=3
    check "$OUT/run" --search
    ;;
  resume)
    ckpt=(--set train.epochs=3 --set checkpoint.every_steps=20 --set checkpoint.every_minutes=0
          --set checkpoint.keep=5)
    run run "${ckpt[@]}" --set train.max_steps=50
    ls "$OUT/run/tensorboard/train"/events.out.tfevents.* > /dev/null 2>&1 || fail "no event file after the first run"
    [ -f "$OUT/run/checkpoints/step-00000040/manifest.json" ] \
      || { ls -R "$OUT/run/checkpoints"; fail "no checkpoint of step 40"; }
    run run "${ckpt[@]}" --resume auto
    from=$("$venv/bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["resumed_from"]["step"])' \
      "$OUT/run/report.json") || fail "the second run did not resume (no resumed_from in report.json)"
    [ "$from" = 40 ] || fail "the second run resumed from step $from, expected the newest checkpoint, 40"
    check "$OUT/run" --resumed-step 40 --files 2
    ;;
  *) fail "unknown scenario '$SCENARIO' (search, resume)" ;;
esac
echo "ok: $SCENARIO"

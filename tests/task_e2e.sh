#!/usr/bin/env bash
# Tasks end to end with real ranks (Note [task], Note [task choice]).
#
# usage: task_e2e.sh MPIRUN "MPI FLAGS" BATCHDIST MODEL_DIFF MAKE_DATA SRC_DIR OUTDIR SCENARIO
#   regression   float targets (y.npy N x 3) on 2 ranks with a padded last batch:
#                task.name auto picks regression; the mse falls; eval_mse and eval_mae
#                in report.json (and its history), metrics.jsonl, report.html,
#                TensorBoard and the closing line, no eval_accuracy anywhere; rank 0
#                killed after the checkpoint of step 8 and resumed: bitwise equal
#   task_errors  task.name regression on class labels, classification on float
#                targets, model.outputs that is not the targets' k: exit 2, named
set -u
mpirun=$1 flags=$2 bin=$3 diff=$4 make=$5 src=$6 out=$7 scenario=$8
cfg=$src/configs/regression-tiny.yaml
. "$(dirname "$0")/mpi_job_lib.sh"
own_scratch_out

run() { run_into "$@"; }

"$make" npy "$out/reg" --dtype float32 --shape 24 --targets 3 --val 40 >/dev/null || fail "make_data npy --targets"

case "$scenario" in
  regression)
    # 120 samples, global 16: 7.5 steps per epoch, padded to 8 (Note [equal shards]).
    base=(--set data.path="$out/reg" --set checkpoint.every_steps=4 --set checkpoint.every_minutes=0)
    run full 2 "${base[@]}"; [ "$rc" = 0 ] || { cat "$out/full.log"; fail "regression run: exit $rc"; }
    grep -q 'task: regression (task.name: auto; npy has float targets), 3 outputs' "$out/full.log" \
      || { cat "$out/full.log"; fail "the console does not say which task and why"; }
    [ "$(json full task)" = regression ] || fail "report.json task = $(json full task)"
    [ "$(json full best_metric)" = mse ] || fail "report.json best_metric = $(json full best_metric)"
    [ "$(json full plan samples_padded)" -gt 0 ] || fail "no padded samples: the test needs a padded last batch"
    python3 - "$out/full" <<'PY' || fail "the regression metrics (above)"
import json, sys
run = sys.argv[1]
r = json.load(open(run + "/report.json"))
assert "eval_accuracy" not in r, "report.json has eval_accuracy"
first, last = r["history"][0], r["history"][-1]
for h in (first, last):
    assert {"eval_mse", "eval_mae"} <= set(h) and "eval_accuracy" not in h, h
assert r["eval_mse"] == last["eval_mse"] and r["eval_mae"] == last["eval_mae"], (r["eval_mse"], last)
assert last["eval_mse"] < first["eval_mse"] / 2, f"the mse did not fall: {first['eval_mse']} -> {last['eval_mse']}"
assert abs(r["eval_loss"] - r["eval_mse"]) < 1e-9, "eval_loss is the mse"
ends = [m for m in map(json.loads, open(run + "/metrics.jsonl")) if m["kind"] == "epoch"]
assert len(ends) == len(r["history"]), f"{len(ends)} epoch-end lines in metrics.jsonl"
assert all("eval_mse" in e and "eval_mae" in e and "eval_accuracy" not in e for e in ends), ends[-1]
html = open(run + "/report.html").read()
assert 'id="plot-mse"' in html and "held-out mse" in html, "report.html has no mse chart"
assert "eval mse " in html and "plot-accuracy" not in html, "report.html speaks of accuracy"
print(f"ok: eval mse {first['eval_mse']:.4g} -> {last['eval_mse']:.4g}, mae {last['eval_mae']:.4g}")
PY
    grep -aqr 'eval/mse' "$out/full/tensorboard" && grep -aqr 'eval/mae' "$out/full/tensorboard" \
      || fail "no eval/mse and eval/mae in the TensorBoard events"
    ! grep -aqr 'eval/accuracy' "$out/full/tensorboard" || fail "eval/accuracy in the TensorBoard events"
    grep -q '^done: .*eval mse [0-9.e-]*, eval mae [0-9.e-]*,' "$out/full.log" \
      || { tail -n 3 "$out/full.log"; fail "the closing line does not give the mse and mae"; }
    BATCHDIST_FAULT_CHECKPOINT=after_rename BATCHDIST_FAULT_CHECKPOINT_STEP=8 run cut 2 "${base[@]}"
    [ "$rc" != 0 ] || fail "the cut run was not killed"
    run cut 2 "${base[@]}" --resume auto
    [ "$rc" = 0 ] || { cat "$out/cut.log"; fail "resumed run: exit $rc"; }
    grep -q 'resume: .*step 8' "$out/cut.log" || { cat "$out/cut.log"; fail "did not resume from step 8"; }
    "$diff" "$out/full/model.pt" "$out/cut/model.pt" 0 || fail "resumed model differs from the uninterrupted one"
    [ "$(json cut eval_mse)" = "$(json full eval_mse)" ] || fail "resumed eval_mse $(json cut eval_mse) != $(json full eval_mse)"
    [ "$(json cut history 0 eval_mse)" = "$(json full history 0 eval_mse)" ] \
      || fail "the resumed run's history (from the checkpoint) differs"
    echo "ok: regression resumed at step 8 of 48: bitwise equal, the same metrics and history"
    ;;
  task_errors)
    "$make" npy "$out/cls" --shape 24 >/dev/null || fail "make_data npy"
    run labels 2 --set data.path="$out/cls" --set task.name=regression
    expect_error labels 2 "task.name: regression needs float targets, but data.name npy gives class labels"
    run floats 2 --set data.path="$out/reg" --set task.name=classification
    expect_error floats 2 "task.name: classification needs integer class labels, but npy's y.npy holds floats"
    run outputs 2 --set data.path="$out/reg" --set model.outputs=2
    expect_error outputs 2 "model.outputs: 2, but the targets have 3 values per sample"
    run unknown 2 --set data.path="$out/reg" --set task.name=ranking
    expect_error unknown 2 "task.name" "ranking"
    echo "ok: a task that does not fit the data, a head that does not fit the targets: exit 2, named"
    ;;
  *) fail "unknown scenario $scenario" ;;
esac

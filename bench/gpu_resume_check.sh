#!/usr/bin/env bash
# The resume step of bench/gpu_acceptance.sh: checkpoint at step K, kill, resume,
# and compare with the uninterrupted run bit for bit (tests/checkpoint_resume.sh's
# method, on whatever device the --set arguments name). One rank:
#   full     CONFIG for STEPS optimizer steps (train.max_steps), model.dropout 0.1
#            (so the device's RNG must be restored), a checkpoint every K/2 steps
#   cut      the same run, killed by SIGKILL right after the checkpoint at step K is
#            in place (BATCHDIST_FAULT_CHECKPOINT=after_rename at step K: the
#            process raises SIGKILL itself, as kill -9 would, at a known step; a
#            kill from outside can land after a fast GPU has finished)
#   resumed  the cut run again with --resume auto, into the same output
#   diff     MODEL_DIFF full/model.pt cut/model.pt 0 (diff.txt: tensors compared,
#            how many are not bitwise equal, the largest difference)
# Exit 0 when the resumed model is bitwise equal to the uninterrupted one and
# the steps match, 1 otherwise (a FAIL line says why).
#
#   bench/gpu_resume_check.sh OUT BATCHDIST MODEL_DIFF CONFIG STEPS K [batchdist args...]
#     e.g. ... 200 100 --set train.device=cuda --set dist.backend=nccl
set -u
[ $# -ge 6 ] || { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
out=$1 bin=$2 diff=$3 cfg=$4 steps=$5 k=$6
shift 6
every=$(( k / 2 ))
[ "$every" -ge 1 ] || every=$k
mpi=(mpirun --bind-to none -np 1)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
common=(-q --set train.max_steps="$steps" --set model.dropout=0.1
        --set checkpoint.every_steps="$every" --set checkpoint.every_minutes=0 "$@")
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$out"
rm -rf "$out/full" "$out/cut"

echo "full: $steps steps, a checkpoint every $every"
code=0
"${mpi[@]}" "$bin" "$cfg" --output "$out/full" "${common[@]}" >"$out/full.log" 2>&1 || code=$?
[ "$code" = 0 ] || { tail -n 5 "$out/full.log"; fail "uninterrupted run: exit $code"; }
echo "cut: killed after the checkpoint at step $k"
code=0
"${mpi[@]}" -x BATCHDIST_FAULT_CHECKPOINT=after_rename -x BATCHDIST_FAULT_CHECKPOINT_STEP="$k" \
  "$bin" "$cfg" --output "$out/cut" "${common[@]}" >"$out/cut.log" 2>&1 || code=$?
echo "cut: exit $code"
grep -q 'BATCHDIST_FAULT_CHECKPOINT=after_rename: killing' "$out/cut.log" ||
  { tail -n 5 "$out/cut.log"; fail "the run was not killed at step $k"; }
[ -d "$out/cut/checkpoints/step-$(printf %08d "$k")" ] || fail "no checkpoint at step $k"
[ ! -f "$out/cut/report.json" ] || fail "the cut run wrote a report: it was not killed"
echo "resumed: --resume auto"
code=0
"${mpi[@]}" "$bin" "$cfg" --output "$out/cut" "${common[@]}" --resume auto >"$out/resumed.log" 2>&1 || code=$?
[ "$code" = 0 ] || { tail -n 5 "$out/resumed.log"; fail "resumed run: exit $code"; }
grep -aoE 'resume: .*' "$out/resumed.log" | head -n 2
code=0
"$diff" "$out/full/model.pt" "$out/cut/model.pt" 0 >"$out/diff.txt" 2>&1 || code=$?
cat "$out/diff.txt"
[ "$code" = 0 ] || fail "the resumed model is not bitwise equal to the uninterrupted run's (model_diff exit $code)"
steps_of() { grep -o '"steps": [0-9]*' "$1" | head -n 1 | sed 's/.*: //'; }
[ "$(steps_of "$out/full/report.json")" = "$(steps_of "$out/cut/report.json")" ] ||
  fail "steps: $(steps_of "$out/full/report.json") uninterrupted, $(steps_of "$out/cut/report.json") resumed"
echo "ok: resumed from step $k, bitwise equal"

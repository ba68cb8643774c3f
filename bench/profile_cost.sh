#!/usr/bin/env bash
# Benchmark, not a test: what a profile section costs the training steps (Note
# [step profiler]). Baseline: the same job without a profile section, in the same
# rounds. Three figures per model, medians over the rounds:
#   untraced  the median step of a run with `profile` (its steps outside the
#             traced ones, the first left out) / the baseline's median step
#             (phases.json steady_step): what having the section costs the
#             steps it does not trace (expected 1.00)
#   traced    the median traced step / the baseline's median step: what the
#             active steps pay while the profiler records (the last one also
#             writes the trace; the median is of the three)
# and the size of a rank's trace.
# The jobs: the quickstart MLP (embedded digits) and the CNN on synthetic 3x32x32
# images, 2 ranks, 1 thread each, train.max_steps steps, profile wait 5 warmup 2
# active 3. Settings interleaved round by round.
#   bash bench/profile_cost.sh [--rounds N] [--steps S] [--bin BATCHDIST]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/build/launcher/batchdist rounds=5 steps=40
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "no batchdist at $bin: build it first (README)" >&2; exit 2; }
out=$(mktemp -d /tmp/batchdist-profile-cost.XXXXXX)
trap 'rm -rf "$out"' EXIT
flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
uptime
declare -A model_args=(
  [mlp]="--set batch.per_gpu=32"
  [cnn]="--set model.name=cnn --set data.name=synthetic_images --set data.samples=4096 --set data.shape=[3,32,32] --set batch.global=64 --set batch.per_gpu=32"
)
common="--set train.threads=1 --set train.max_steps=$steps --set train.progress=off --set report.tensorboard=false"
profile="--set profile.wait=5 --set profile.warmup=2 --set profile.active=3"
for r in $(seq 1 "$rounds"); do
  for m in mlp cnn; do
    for s in off on; do
      d=$out/$m-$s-$r
      # shellcheck disable=SC2086
      mpirun $flags -np 2 "$bin" "$here/configs/quickstart.yaml" --output "$d" $common ${model_args[$m]} \
        $([ "$s" = on ] && echo "$profile") >"$d.log" 2>&1 || { tail -n 20 "$d.log"; exit 1; }
    done
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print(f"{'model':6} {'baseline step':>14} {'untraced':>9} {'traced':>8}  trace size")
for m in ("mlp", "cnn"):
    base, untraced, traced, sizes = [], [], [], []
    for r in range(1, rounds + 1):
        b = json.load(open(f"{out}/{m}-off-{r}/phases.json"))["steady_step"]
        p = json.load(open(f"{out}/{m}-on-{r}/report.json"))["profile"]
        base.append(b)
        untraced.append(p["other_step_seconds"] / b)
        traced.append(p["traced_step_seconds"] / b)
        import os
        sizes.append(os.path.getsize(p["file"]))
    print(f"{m:6} {statistics.median(base) * 1000:11.2f} ms {statistics.median(untraced):8.2f}x "
          f"{statistics.median(traced):7.2f}x  {statistics.median(sizes) / 1e6:.1f} MB per rank")
PY

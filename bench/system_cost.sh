#!/usr/bin/env bash
# Benchmark, not a test: what sampling the system metrics costs the training
# steps (Note [system metrics]). Baseline: the same job with report.sample_s 0
# (no sampler thread), in the same rounds. Per model, the median over the rounds
# of the median step (phases.json steady_step) with the sampler at the default
# 0.5 s and at 0.05 s (ten times denser), over the baseline's.
# The jobs: the quickstart MLP (embedded digits) and the CNN on synthetic 3x32x32
# images, 2 ranks, 1 thread each. Settings interleaved round by round. On a CPU
# machine NVML is not read (no GPU): the figure is the CPU side's.
#   bash bench/system_cost.sh [--rounds N] [--bin BATCHDIST]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/build/launcher/batchdist rounds=5
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "no batchdist at $bin: build it first (README)" >&2; exit 2; }
out=$(mktemp -d /tmp/batchdist-system-cost.XXXXXX)
trap 'rm -rf "$out"' EXIT
flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
uptime
declare -A model_args=(
  [mlp]="--set batch.per_gpu=32 --set train.max_steps=3000 --set train.epochs=1000"
  [cnn]="--set model.name=cnn --set data.name=synthetic_images --set data.samples=4096 --set data.shape=[3,32,32] --set batch.global=64 --set batch.per_gpu=32 --set train.max_steps=200"
)
common="--set train.threads=1 --set train.progress=off --set report.tensorboard=false"
for r in $(seq 1 "$rounds"); do
  for m in mlp cnn; do
    for s in 0 0.5 0.05; do
      d=$out/$m-$s-$r
      # shellcheck disable=SC2086
      mpirun $flags -np 2 "$bin" "$here/configs/quickstart.yaml" --output "$d" $common ${model_args[$m]} \
        --set report.sample_s=$s >"$d.log" 2>&1 || { tail -n 20 "$d.log"; exit 1; }
    done
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
print(f"{'model':6} {'baseline step':>14} {'sample_s 0.5':>13} {'sample_s 0.05':>14}  samples/rank at 0.05")
for m in ("mlp", "cnn"):
    base, default, dense, samples = [], [], [], []
    for r in range(1, rounds + 1):
        step = lambda s: json.load(open(f"{out}/{m}-{s}-{r}/phases.json"))["steady_step"]
        b = step("0")
        base.append(b)
        default.append(step("0.5") / b)
        dense.append(step("0.05") / b)
        samples.append(json.load(open(f"{out}/{m}-0.05-{r}/report.json"))["system"]["ranks"][0]["run"]["samples"])
    print(f"{m:6} {statistics.median(base) * 1000:11.2f} ms {statistics.median(default):12.3f}x "
          f"{statistics.median(dense):13.3f}x  {statistics.median(samples)}")
PY

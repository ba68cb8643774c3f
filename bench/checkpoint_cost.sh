#!/usr/bin/env bash
# Benchmark, not a test: what a checkpoint costs (Note [checkpoint]). For the
# quickstart (2 ranks) and ResNet-50 on synthetic images (configs/resnet50-synthetic.yaml
# on CPU, a few steps, 1 rank), writes a checkpoint every N steps and prints the
# write time and bytes per checkpoint (from the run report), the time per
# training step, and the share of training time checkpoints would take at the
# default interval (checkpoint.every_minutes: 30): write seconds / 1800 s.
#   bench/checkpoint_cost.sh [BATCHDIST_BIN] [OUTDIR]
set -euo pipefail
bin=${1:-build/launcher/batchdist}
out=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")/.." && pwd)
flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"

summary() {  # summary NAME REPORT
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
name, path = sys.argv[1], sys.argv[2]
r = json.load(open(path))
cps = [c for c in r["checkpoints"] if "error" not in c]
secs = [c["seconds"] for c in cps]
steps = r["steps"]
train_s = r["wall_s"] - r["checkpoint_seconds"]
per_step = train_s / max(1, steps)
med = statistics.median(secs)
print(f"{name}: {len(cps)} checkpoints of {cps[0]['bytes'] / 2**20:.2f} MiB, write median {med:.3f} s "
      f"(min {min(secs):.3f}, max {max(secs):.3f}); {per_step:.3f} s per training step; "
      f"checkpoints took {100 * r['checkpoint_seconds'] / r['wall_s']:.1f} % of this run; "
      f"at the default interval (30 min) {100 * med / 1800:.3f} % of training time")
PY
}

# shellcheck disable=SC2086
mpirun $flags -np 2 "$bin" "$here/configs/quickstart.yaml" -q --output "$out/quickstart" \
  --set train.epochs=5 --set checkpoint.every_steps=10 --set checkpoint.keep=2
summary "quickstart (mlp 128-64, 2 ranks)" "$out/quickstart/report.json"

# shellcheck disable=SC2086
mpirun $flags -np 1 "$bin" "$here/configs/resnet50-synthetic.yaml" -q --output "$out/resnet50" \
  --set train.device=cpu --set data.samples=256 --set batch.per_gpu=8 --set train.max_steps=6 \
  --set data.val_fraction=0.02 --set checkpoint.every_steps=2 --set checkpoint.keep=2
summary "resnet50 (imagenet stem, 224x224, per-GPU batch 8, 1 rank, CPU)" "$out/resnet50/report.json"

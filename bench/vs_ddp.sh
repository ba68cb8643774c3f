#!/usr/bin/env bash
# Benchmark, not a test: batchdist against PyTorch DDP (python3-torch, gloo) on
# the same CPU workload (MLP 256-512-512-10 on synthetic data, global batch 256,
# 2 ranks, same threads per rank), runs interleaved A B A B ..., ratio per pair.
#   bench/vs_ddp.sh [BATCHDIST_BIN] [PAIRS]        (needs: apt-get install python3-torch)
set -euo pipefail
bin=${1:-build/launcher/batchdist}
pairs=${2:-5}
here=$(cd "$(dirname "$0")" && pwd)
flags="--oversubscribe"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
out=$(mktemp -d)
cat >"$out/bench.yaml" <<YAML
model: {name: mlp, hidden: [512, 512], batchnorm: false}
data: {name: synthetic, samples: 8192, shape: [256], classes: 10, val_fraction: 0}
batch: {global: 256}
optim: {name: sgd, lr: 0.05, base_batch: 256, momentum: 0.9}
train: {epochs: 1, max_steps: 65, check_finite: false}
YAML
ratios=()
for i in $(seq 1 "$pairs"); do
  mpirun $flags -np 2 "$bin" "$out/bench.yaml" -q --output "$out/run" --report "$out/r.json"
  a=$(grep -o '"samples_per_s": [0-9.e+]*' "$out/r.json" | head -1 | awk '{print $2}')
  b=$(mpirun $flags -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$((29500 + i)) \
        /usr/bin/python3 "$here/ddp_baseline.py" --steps 60 --warmup 5 | awk '/samples_per_s/ {print $2}')
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')
  ratios+=("$r")
  echo "pair $i: batchdist $a samples/s, PyTorch DDP $b samples/s, ratio $r"
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2;
  printf "batchdist / PyTorch DDP samples/s: median %.3f (min %.3f, max %.3f, %d pairs)\n", m, v[1], v[NR], NR}'
rm -rf "$out"

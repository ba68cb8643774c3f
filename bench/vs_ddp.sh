#!/usr/bin/env bash
# Benchmark, not a test: batchdist against PyTorch DDP (gloo) on the same CPU
# workload (MLP 256-512-512-10 on synthetic data, global batch 256, 2 ranks, same
# threads per rank, same mpirun), once per LibTorch:
#   1.13: batchdist of the Debian build vs DDP from Debian's python3-torch
#   2.x:  batchdist of the CUDA leg's build (running on the CPU) vs DDP from the
#         venv tests/cuda_leg.sh made (the same torch wheel it links)
# Each pair runs batchdist then DDP back to back, pairs interleaved
# (1.13 A B, 2.x A B, 1.13 A B, ...); the ratio is per pair, the median over pairs.
#
# Both sides time 120 steps of 128 samples per rank (batchdist: the whole epochs,
# first step included; DDP: after 5 untimed steps). The 1.13 leg's speed depends
# on the BLAS behind Debian's libblas.so.3 (Note [host blas]); its name is printed.
#
#   [BACKEND=gloo|mpi] bench/vs_ddp.sh [BATCHDIST_BIN] [PAIRS] [BATCHDIST_BIN_2X]
#     defaults: build/launcher/batchdist 5 build-cuda/launcher/batchdist; BACKEND
#     is batchdist's dist.backend [auto] (DDP always uses gloo)
# A leg whose binary or torch is missing is reported as skipped.
set -euo pipefail
bin=${1:-build/launcher/batchdist}
pairs=${2:-5}
bin2=${3:-build-cuda/launcher/batchdist}
here=$(cd "$(dirname "$0")" && pwd)
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat >"$out/bench.yaml" <<YAML
model: {name: mlp, hidden: [512, 512], batchnorm: false}
data: {name: synthetic, samples: 8192, shape: [256], classes: 10, val_fraction: 0}
batch: {global: 256}
optim: {name: sgd, lr: 0.05, base_batch: 256, momentum: 0.9}
train: {epochs: 4, max_steps: 120, check_finite: false, device: cpu}
YAML

# Legs: name, batchdist binary, python with the matching torch.
names=() bins=() pys=()
add_leg() {
  local name=$1 b=$2 py=$3 why=""
  if [ ! -x "$b" ]; then
    why="no $b"
  elif ! "$py" -c 'import torch.distributed' 2>/dev/null; then
    why="no torch for $py"
  fi
  if [ -n "$why" ]; then
    echo "torch $name: skipped ($why)"
    return
  fi
  names+=("$name") bins+=("$b") pys+=("$py")
}
add_leg 1.13 "$bin" /usr/bin/python3
add_leg 2.x "$bin2" "$("$here/../tests/cuda_leg.sh" --venv-path)/bin/python"
[ ${#names[@]} -gt 0 ] || { echo "vs_ddp.sh: nothing to compare" >&2; exit 1; }

echo "libblas.so.3 of the 1.13 leg: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo none)"
declare -A ratios
# MASTER_PORT: one the kernel has free now, not a fixed 29500 (PyTorch's default,
# which another job on this machine, or a second copy of this script, may hold).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
for i in $(seq 1 "$pairs"); do
  for k in "${!names[@]}"; do
    mpirun "${flags[@]}" -np 2 "${bins[$k]}" "$out/bench.yaml" -q --output "$out/run" --report "$out/r.json" \
      --set dist.backend="${BACKEND:-auto}"
    a=$(grep -o '"samples_per_s": [0-9.e+]*' "$out/r.json" | head -1 | awk '{print $2}')
    b=$(mpirun "${flags[@]}" -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$(free_port)" \
          "${pys[$k]}" -W ignore "$here/ddp_baseline.py" --steps 120 --warmup 5 | awk '/samples_per_s/ {print $2}')
    r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')
    ratios[$k]+="$r "
    echo "pair $i, torch ${names[$k]}: batchdist $a samples/s, PyTorch DDP $b samples/s, ratio $r"
  done
done
for k in "${!names[@]}"; do
  tr ' ' '\n' <<<"${ratios[$k]}" | grep . | sort -n | awk -v name="${names[$k]}" '{v[NR]=$1} END {
    m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2;
    printf "torch %s: batchdist / PyTorch DDP samples/s: median %.3f (min %.3f, max %.3f, %d pairs)\n", name, m, v[1], v[NR], NR}'
done

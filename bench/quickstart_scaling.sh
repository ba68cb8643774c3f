#!/usr/bin/env bash
# Benchmark, not a test: the quickstart workload (MLP 64-128-64-10 with BatchNorm,
# digits-sized data, global batch 64, SGD with momentum, 1 thread per rank) on one
# host's CPU, three legs run interleaved A B C, A B C, ...:
#   A  batchdist, 2 ranks (configs/quickstart.yaml)
#   B  batchdist, 1 rank at the same per-rank batch (32)
#   C  PyTorch DDP over Gloo, 2 ranks, the same model, batch and optimizer
#      (bench/ddp_baseline.py with Debian's python3-torch, same mpirun)
# Prints per round the samples/s of each and the ratios A/C (vs DDP) and A/B
# (2-rank scaling: 2.0 is linear), then the medians.
#   bench/quickstart_scaling.sh [BATCHDIST_BIN] [ROUNDS]
set -euo pipefail
bin=${1:-build/launcher/batchdist}
rounds=${2:-5}
here=$(cd "$(dirname "$0")" && pwd)
cfg=$here/../configs/quickstart.yaml
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
py=/usr/bin/python3  # Debian's python3-torch (1.13), as the batchdist build
"$py" -c 'import torch.distributed' 2>/dev/null ||
  { echo "needs python3 with torch (Debian: apt-get install python3-torch)"; exit 1; }

batchdist() {  # NP GLOBAL -> samples/s of the training steps
  mpirun "${flags[@]}" -np "$1" "$bin" "$cfg" -q --output "$out/run" --report "$out/r.json" \
    --set batch.global="$2" --set train.epochs=10 --set train.check_finite=false >/dev/null
  "$py" -c 'import json, sys; print("%.0f" % json.load(open(sys.argv[1]))["samples_per_s"])' "$out/r.json"
}
ddp() {
  mpirun "${flags[@]}" -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$((29500 + RANDOM % 500)) \
    "$py" "$here/ddp_baseline.py" --model mlp --samples 1437 --dim 64 --hidden 128 64 --batchnorm \
    --weight-decay 1e-4 --global-batch 64 --steps 220 --warmup 20 | awk '/samples_per_s/ { printf "%.0f\n", $2 }'
}

printf "round  A: batchdist np2  B: batchdist np1  C: DDP np2   A/C    A/B\n"
vs_ddp=() scaling=()
for r in $(seq 1 "$rounds"); do
  a=$(batchdist 2 64)
  b=$(batchdist 1 32)
  c=$(ddp)
  x=$(awk -v a="$a" -v c="$c" 'BEGIN { printf "%.3f", a / c }')
  y=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')
  vs_ddp+=("$x") scaling+=("$y")
  printf "%5d  %16s  %16s  %10s  %5s  %5s\n" "$r" "$a" "$b" "$c" "$x" "$y"
done
median() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "median A/C (batchdist 2 ranks vs DDP 2 ranks): $(median "${vs_ddp[@]}")  (target >= 2.0)"
echo "median A/B (2 ranks vs 1 rank, same per-rank batch): $(median "${scaling[@]}")  (target >= 1.7)"

#!/usr/bin/env bash
# Benchmark, not a test: the quickstart workload (MLP 64-128-64-10 with BatchNorm,
# digits-sized data, global batch 64, SGD with momentum, 1 thread per rank) on one
# host's CPU, four legs run interleaved A B C D, A B C D, ...:
#   A  batchdist, 2 ranks (configs/quickstart.yaml), dist.backend: gloo
#   B  batchdist, 2 ranks, dist.backend: mpi
#   C  batchdist, 1 rank at the same per-rank batch (32)
#   D  PyTorch DDP over Gloo, 2 ranks, the same model, batch and optimizer
#      (bench/ddp_baseline.py with Debian's python3-torch, same mpirun)
#   E  the machine's own ceiling: two independent 1-rank runs (C) side by side,
#      no communication at all; their samples/s summed. Two busy cores do not
#      each run as fast as one busy core alone (shared caches, memory, and on a
#      VM the host), so E/C is the most any 2-rank run can reach here.
# Prints per round the samples/s of each and the ratios vs DDP (A/D, B/D), the
# 2-rank scaling (A/C, B/C: 2.0 is linear), the ceiling E/C and B/E (the share
# of the ceiling that batchdist's 2 ranks reach), then the medians. Each leg trains
# 40 epochs (880 steps; DDP: 880 timed steps after 20), long enough that a
# leg is not decided by a few milliseconds of start-up noise.
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

batchdist() {  # NP GLOBAL BACKEND -> samples/s of the training steps
  mpirun "${flags[@]}" -np "$1" "$bin" "$cfg" -q --output "$out/run" --report "$out/r.json" \
    --set batch.global="$2" --set dist.backend="$3" --set train.epochs=40 \
    --set train.check_finite=false --set train.threads=1 >/dev/null
  "$py" -c 'import json, sys; print("%.0f" % json.load(open(sys.argv[1]))["samples_per_s"])' "$out/r.json"
}
side_by_side() {  # two C legs at once, each into its own output -> summed samples/s
  local o1=$out/e1 o2=$out/e2
  mkdir -p "$o1" "$o2"
  out=$o1 batchdist 1 32 gloo >"$o1.sps" &
  out=$o2 batchdist 1 32 gloo >"$o2.sps"
  wait
  awk '{ s += $1 } END { printf "%.0f\n", s }' "$o1.sps" "$o2.sps"
}
# MASTER_PORT: one the kernel has free now (a guess in 29500-29999 could be held).
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ddp() {
  mpirun "${flags[@]}" -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$(free_port)" \
    "$py" "$here/ddp_baseline.py" --model mlp --samples 1437 --dim 64 --hidden 128 64 --batchnorm \
    --weight-decay 1e-4 --global-batch 64 --steps 880 --warmup 20 | awk '/samples_per_s/ { printf "%.0f\n", $2 }'
}

printf "round  A: gloo np2  B: mpi np2  C: np1   D: DDP np2  E: 2 x np1   A/D    B/D    A/C    B/C    E/C    B/E\n"
ad=() bd=() ac=() bc=() ec=() be=()
ratio() { awk -v x="$1" -v y="$2" 'BEGIN { printf "%.3f", x / y }'; }
for r in $(seq 1 "$rounds"); do
  a=$(batchdist 2 64 gloo)
  b=$(batchdist 2 64 mpi)
  c=$(batchdist 1 32 gloo)
  d=$(ddp)
  e=$(side_by_side)
  ad+=("$(ratio "$a" "$d")") bd+=("$(ratio "$b" "$d")") ac+=("$(ratio "$a" "$c")") bc+=("$(ratio "$b" "$c")")
  ec+=("$(ratio "$e" "$c")") be+=("$(ratio "$b" "$e")")
  printf "%5d  %10s  %9s  %7s  %11s  %10s  %5s  %5s  %5s  %5s  %5s  %5s\n" "$r" "$a" "$b" "$c" "$d" "$e" \
    "${ad[-1]}" "${bd[-1]}" "${ac[-1]}" "${bc[-1]}" "${ec[-1]}" "${be[-1]}"
done
median() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "median vs DDP (target >= 2.0):               gloo $(median "${ad[@]}")  mpi $(median "${bd[@]}")"
echo "median 2 ranks / 1 rank (target >= 1.7):     gloo $(median "${ac[@]}")  mpi $(median "${bc[@]}")"
echo "median ceiling, 2 x 1 rank side by side / 1 rank: $(median "${ec[@]}")"
echo "median mpi 2 ranks / that ceiling:              $(median "${be[@]}")"

#!/usr/bin/env bash
# Benchmark, not a test: the overlapped reducer (dist.overlap: true, the default)
# against the copy-then-allreduce path (dist.overlap: false) on a
# communication-heavy CPU case: a wide MLP (4 x 1024 hidden, ~3.4 M parameters,
# 13 MB of gradients) at a small per-rank batch, 2 ranks. Runs interleaved
# A B A B ..., and prints per pair: samples/s and the exposed communication per
# step (report.json time_breakdown.comm_s / steps) of each, and their ratios;
# then the medians.
#   [BACKEND=gloo|mpi] bench/overlap.sh [BATCHDIST_BIN] [PAIRS] [NP]
#     BACKEND is dist.backend [auto: mpi on one host]
set -euo pipefail
bin=${1:-build/launcher/batchdist}
pairs=${2:-5}
np=${3:-2}
flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat >"$out/bench.yaml" <<YAML
model: {name: mlp, hidden: [1024, 1024, 1024, 1024], batchnorm: false}
data: {name: synthetic, samples: 8192, shape: [256], classes: 10, val_fraction: 0}
batch: {global: $((16 * np))}
optim: {name: sgd, lr: 0.01, base_batch: 256, momentum: 0.9}
train: {epochs: 1, max_steps: 120, check_finite: false, threads: 1}
dist: {bucket_mb: 2}
YAML
run() {  # run OVERLAP -> "samples_per_s comm_per_step_ms"
  # shellcheck disable=SC2086
  mpirun $flags -np "$np" "$bin" "$out/bench.yaml" -q --output "$out/run" --report "$out/r.json" \
    --set dist.overlap="$1" --set dist.backend="${BACKEND:-auto}" >/dev/null
  python3 - "$out/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(r["samples_per_s"], 1000 * r["time_breakdown"]["comm_s"] / max(1, r["steps"]))
PY
}
sps_ratios=(); comm_ratios=()
for i in $(seq 1 "$pairs"); do
  read -r a_sps a_comm < <(run true)
  read -r b_sps b_comm < <(run false)
  sr=$(awk -v a="$a_sps" -v b="$b_sps" 'BEGIN { printf "%.3f", a / b }')
  cr=$(awk -v a="$a_comm" -v b="$b_comm" 'BEGIN { printf "%.3f", (b > 0 ? a / b : 0) }')
  sps_ratios+=("$sr"); comm_ratios+=("$cr")
  printf 'pair %d: overlap %.0f samples/s, %.2f ms exposed comm/step | no overlap %.0f samples/s, %.2f ms | samples/s ratio %s, exposed comm ratio %s\n' \
    "$i" "$a_sps" "$a_comm" "$b_sps" "$b_comm" "$sr" "$cr"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2)}'; }
echo "median samples/s ratio (overlap / no overlap): $(median "${sps_ratios[@]}")"
echo "median exposed-communication ratio (overlap / no overlap): $(median "${comm_ratios[@]}")"

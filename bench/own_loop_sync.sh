#!/usr/bin/env bash
# Benchmark, not a test: batchdist::DataParallel (a program's own loop, gloo and mpi
# backends) against the loop LibTorch C++ users write without it, the named baseline
# "naive": after backward, one blocking MPI_Allreduce per parameter's gradient (no
# overlap, no buckets), then divide by the world size. 2 ranks on this host, an MLP
# with tens of MB of gradients (bench/own_loop_sync/main.cc), one thread per rank.
# Installs BUILD_DIR to a scratch prefix and builds bench/own_loop_sync against it
# with find_package(batchdist), as a user would; then runs the three modes
# interleaved for ROUNDS rounds, the order rotating (naive gloo mpi, gloo mpi naive,
# mpi naive gloo, ...), each run WARMUP untimed steps and STEPS timed ones. Prints
# each run's line, then per mode the medians over the rounds: samples/s, its ratio
# to naive (per round, then the median), forward+backward and the sync part
# (seconds a step), and in how many runs every rank's parameters ended identical.
#   [STEPS=N] [WARMUP=K] [WIDTH=W] [DEPTH=D] [BATCH=B] bench/own_loop_sync.sh [BUILD_DIR] [ROUNDS]
#     defaults: build 5; STEPS 30, WARMUP 5; WIDTH, DEPTH, BATCH (per rank): main.cc's
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
rounds=${2:-5}
here=$(cd "$(dirname "$0")" && pwd)
flags=(--oversubscribe --bind-to none -np 2)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
args=(--steps "${STEPS:-30}" --warmup "${WARMUP:-5}")
[ -z "${WIDTH:-}" ] || args+=(--width "$WIDTH")
[ -z "${DEPTH:-}" ] || args+=(--depth "$DEPTH")
[ -z "${BATCH:-}" ] || args+=(--batch "$BATCH")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cmake --install "$build" --prefix "$out/prefix" >/dev/null
cmake -S "$here/own_loop_sync" -B "$out/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$out/prefix" >/dev/null
cmake --build "$out/build" -j"$(nproc)" >/dev/null
uptime

modes=(naive gloo mpi)
for r in $(seq 0 $((rounds - 1))); do
  for k in 0 1 2; do
    m=${modes[$(((r + k) % 3))]}
    line=$(mpirun "${flags[@]}" "$out/build/own_loop_sync" --sync "$m" "${args[@]}" | grep '^mode=')
    echo "round $((r + 1)): $line"
    echo "$((r + 1)) $line" >>"$out/runs"
  done
done

# runs: "ROUND mode=M steps=N median_step_s=... samples_per_s=... backward_s=... sync_s=... grad_mb=... params_equal=E"
awk '
  function median(list,    v, n, i, j, t) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  {
    for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
    m = f["mode"]; sps[m] = sps[m] " " f["samples_per_s"]; bwd[m] = bwd[m] " " f["backward_s"]
    syn[m] = syn[m] " " f["sync_s"]; eq[m] += f["params_equal"]; runs[m]++
    round_sps[$1, m] = f["samples_per_s"]; grad_mb = f["grad_mb"]
  }
  END {
    for (r in round_sps) { split(r, rm, SUBSEP); if (rm[2] != "naive") ratio[rm[2]] = ratio[rm[2]] " " round_sps[r] / round_sps[rm[1], "naive"] }
    ratio["naive"] = " 1"
    printf "gradients %.1f MB a step; medians over %d rounds\n", grad_mb, runs["naive"]
    printf "%-6s %10s %9s %11s %9s %13s\n", "mode", "samples/s", "vs naive", "backward_s", "sync_s", "params_equal"
    split("naive gloo mpi", order, " ")
    for (k = 1; k <= 3; k++) {
      m = order[k]
      printf "%-6s %10.1f %9.3f %11.4f %9.4f %9d/%d\n", m, median(sps[m]), median(ratio[m]), median(bwd[m]), median(syn[m]), eq[m], runs[m]
    }
  }' "$out/runs"

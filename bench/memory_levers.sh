#!/usr/bin/env bash
# Benchmark, not a test: what the memory levers cost and save, on CPU ranks of
# this machine (issue: "What fits decides the batch"). A GPT (Note [gpt]) on
# byte-level tokens of the GPL-3 Debian ships, AdamW, trained at one per-GPU
# batch M under each (dist.shard, model.recompute):
#   none/off  plain data parallel: the baseline
#   optimizer/off, gradients/off, none/on, optimizer/on, gradients/on
# For each world size in RANKS, ROUNDS rounds, the six in a rotated order each
# round (a machine that slows during a round favours none); per run, rank 0's
# report.json: samples/s over the run's STEPS steps, peak memory (peak resident
# set: Note [host allocator] keeps freed memory, so it is the most the step ever
# held), the gradients and optimizer state kept between steps and the rest (Note
# [memory by part]). Printed per world size: medians over the rounds, and each
# lever's samples/s, gradients and state against the baseline's in the same round
# (median of the per-round ratios).
#
# COMBOS="SHARD RECOMPUTE [BACKEND [KEY=VALUE]];..." replaces the six (dist.backend
# auto, which is mpi on one host): e.g. the Gloo emulation of the flat collectives
# against the MPI communicator's native ones (Note [flat collectives]), or
# dist.shard: parameters without its prefetch ("parameters off auto
# dist.prefetch=false", Note [parameter units]); the first is the baseline.
#
# BUCKET_MB sets dist.bucket_mb (default 25, the config's): the reducer's buckets
# and the segments of dist.shard: gradients, whose buffers live only while a
# segment fills or is in flight (Note [gradient scatter]).
#
#   [RANKS="2 4"] [ROUNDS=3] [M=16] [STEPS=30] [BUCKET_MB=25] [GPT_SHAPE="LAYERS HEADS EMBED SEQ_LEN"]
#   [COMBOS="none off gloo;gradients off gloo;none off mpi;gradients off mpi"]
#   bench/memory_levers.sh [BATCHDIST_BIN] [OUT_DIR]
#     defaults: build/launcher/batchdist, a fresh mktemp -d; GPT_SHAPE "4 4 256 128"
set -euo pipefail
bin=${1:-build/launcher/batchdist}
out=${2:-$(mktemp -d /tmp/memory_levers.XXXXXX)}
ranks=${RANKS:-2 4} rounds=${ROUNDS:-3} m=${M:-16} steps=${STEPS:-30} bucket=${BUCKET_MB:-25}
read -r layers heads embed seq <<<"${GPT_SHAPE:-4 4 256 128}"
# shellcheck source=bench/gpt_tokens_lib.sh
source "$(dirname "$0")/gpt_tokens_lib.sh"
echo "memory_levers: $(uptime | sed 's/.*load/load/'); gpt ${layers}x${heads}x${embed}, seq $seq; M=$m, $steps steps, dist.bucket_mb $bucket; out $out"
IFS=';' read -r -a combos <<<"${COMBOS:-none off;optimizer off;gradients off;none on;optimizer on;gradients on}"

# run W SHARD RECOMPUTE BACKEND NAME [KEY=VALUE]: one training run; its report into $out/NAME.
run() {
  local w=$1 shard=$2 rc=$3 backend=$4 name=$5 extra=()
  [ -n "${6:-}" ] && extra=(--set "$6")
  mpirun "${flags[@]}" -np "$w" "$bin" train "$(dirname "$0")/../configs/gpt-tiny.yaml" \
    --set data.path="$out/tokens/train.bin" --set data.val_path="$out/tokens/val.bin" \
    --set model.layers="$layers" --set model.heads="$heads" --set model.embed="$embed" \
    --set model.seq_len="$seq" --set batch.global=$((m * w)) --set batch.per_gpu="$m" \
    --set optim.base_batch=$((m * w)) --set train.max_steps="$steps" --set train.epochs=1000 \
    --set dist.shard="$shard" --set model.recompute="$rc" --set dist.backend="$backend" \
    --set dist.bucket_mb="$bucket" --set checkpoint.every_minutes=0 \
    --set checkpoint.on_signal=false --set report.tensorboard=false "${extra[@]}" \
    --output "$out/$name" --quiet >"$out/$name.log" 2>&1 ||
    { echo "run $name failed: $out/$name.log" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
}

for w in $ranks; do
  for ((r = 0; r < rounds; r++)); do
    for ((k = 0; k < ${#combos[@]}; k++)); do
      read -r shard rc backend extra <<<"${combos[$(((k + r) % ${#combos[@]}))]}"
      tag=$shard-$rc-${backend:-auto}${extra:+-${extra//[^a-z0-9]/_}}
      run "$w" "$shard" "$rc" "${backend:-auto}" "w${w}-r${r}-$tag" "${extra:-}"
    done
  done
  python3 - "$out" "$w" "$rounds" "${combos[@]}" <<'PY'
import json, statistics, sys
out, w, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
import re
def tag(c):
    f = c.split() + ["auto"] * (3 - len(c.split()))
    return "-".join(f[:3]) + ("-" + re.sub("[^a-z0-9]", "_", f[3]) if len(f) > 3 else "")
combos = [tag(c) for c in sys.argv[4:]]
rep = {(c, r): json.load(open(f"{out}/w{w}-r{r}-{c}/report.json")) for c in combos for r in range(rounds)}
med = lambda xs: statistics.median(xs)
print(f"\nW={w}: {rounds} rounds, medians; ratios against {combos[0]} of the same round")
print(f"{'shard/recompute/backend':<24} {'samples/s':>10} {'x plain':>8} {'peak MB':>8} {'params MB':>9} "
      f"{'grads MB':>9} {'x plain':>8} {'state MB':>9} {'x plain':>8} {'rest MB':>8}")
def vs_plain(c, key):
    mine = [rep[c, r]["memory"][key] for r in range(rounds)]
    base = [rep[combos[0], r]["memory"][key] for r in range(rounds)]
    return med(mine), med([m / b for m, b in zip(mine, base)])
for c in combos:
    sps = [rep[c, r]["samples_per_s"] for r in range(rounds)]
    ratio = [rep[c, r]["samples_per_s"] / rep[combos[0], r]["samples_per_s"] for r in range(rounds)]
    mem = [rep[c, r]["memory"] for r in range(rounds)]
    grads, grads_x = vs_plain(c, "gradients_mb")
    state, state_x = vs_plain(c, "optimizer_state_mb")
    print(f"{c.replace('-', '/'):<24} {med(sps):>10.1f} {med(ratio):>8.3f} "
          f"{med([x['peak_mb'] for x in mem]):>8.0f} {med([x['parameters_mb'] for x in mem]):>9.2f} {grads:>9.2f} {grads_x:>8.3f} {state:>9.2f} "
          f"{state_x:>8.3f} {med([x['rest_mb'] for x in mem]):>8.0f}")
PY
done

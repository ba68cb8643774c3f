#!/usr/bin/env bash
# Benchmark, not a test: what the memory levers cost and save, on CPU ranks of
# this machine (issue: "What fits decides the batch"). A GPT (Note [gpt]) on
# byte-level tokens of the GPL-3 Debian ships, AdamW, trained at one per-GPU
# batch M under each (dist.shard, model.recompute):
#   none/off  plain data parallel: the baseline
#   optimizer/off, none/on, optimizer/on
# For each world size in RANKS, ROUNDS rounds, the four in a rotated order each
# round (a machine that slows during a round favours none); per run, rank 0's
# report.json: samples/s over the run's STEPS steps, peak memory (peak resident
# set: Note [host allocator] keeps freed memory, so it is the most the step ever
# held), the optimizer state and the rest (Note [memory by part]). Printed per
# world size: medians over the rounds, and each lever's samples/s and state
# against the baseline's in the same round (median of the per-round ratios).
#
#   [RANKS="2 4"] [ROUNDS=3] [M=16] [STEPS=30] [GPT_SHAPE="LAYERS HEADS EMBED SEQ_LEN"]
#   bench/memory_levers.sh [BATCHDIST_BIN] [OUT_DIR]
#     defaults: build/launcher/batchdist, a fresh mktemp -d; GPT_SHAPE "4 4 256 128"
set -euo pipefail
bin=${1:-build/launcher/batchdist}
out=${2:-$(mktemp -d /tmp/memory_levers.XXXXXX)}
ranks=${RANKS:-2 4} rounds=${ROUNDS:-3} m=${M:-16} steps=${STEPS:-30}
read -r layers heads embed seq <<<"${GPT_SHAPE:-4 4 256 128}"
# shellcheck source=bench/gpt_tokens_lib.sh
source "$(dirname "$0")/gpt_tokens_lib.sh"
echo "memory_levers: $(uptime | sed 's/.*load/load/'); gpt ${layers}x${heads}x${embed}, seq $seq; M=$m, $steps steps; out $out"
combos=("none off" "optimizer off" "none on" "optimizer on")

# run W SHARD RECOMPUTE NAME: one training run; its report into $out/NAME.
run() {
  local w=$1 shard=$2 rc=$3 name=$4
  mpirun "${flags[@]}" -np "$w" "$bin" train "$(dirname "$0")/../configs/gpt-tiny.yaml" \
    --set data.path="$out/tokens/train.bin" --set data.val_path="$out/tokens/val.bin" \
    --set model.layers="$layers" --set model.heads="$heads" --set model.embed="$embed" \
    --set model.seq_len="$seq" --set batch.global=$((m * w)) --set batch.per_gpu="$m" \
    --set optim.base_batch=$((m * w)) --set train.max_steps="$steps" --set train.epochs=1000 \
    --set dist.shard="$shard" --set model.recompute="$rc" --set checkpoint.every_minutes=0 \
    --set checkpoint.on_signal=false --set report.tensorboard=false \
    --output "$out/$name" --quiet >"$out/$name.log" 2>&1 ||
    { echo "run $name failed: $out/$name.log" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
}

for w in $ranks; do
  for ((r = 0; r < rounds; r++)); do
    for ((k = 0; k < 4; k++)); do
      c=${combos[$(((k + r) % 4))]}
      run "$w" ${c% *} ${c#* } "w${w}-r${r}-${c/ /-}"
    done
  done
  python3 - "$out" "$w" "$rounds" <<'PY'
import json, statistics, sys
out, w, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
combos = ["none-off", "optimizer-off", "none-on", "optimizer-on"]
rep = {(c, r): json.load(open(f"{out}/w{w}-r{r}-{c}/report.json")) for c in combos for r in range(rounds)}
med = lambda xs: statistics.median(xs)
print(f"\nW={w}: {rounds} rounds, medians; ratios against none/off (plain DP) of the same round")
print(f"{'shard/recompute':<16} {'samples/s':>10} {'x plain':>8} {'peak MB':>8} {'state MB':>9} "
      f"{'x plain':>8} {'rest MB':>8}")
for c in combos:
    sps = [rep[c, r]["samples_per_s"] for r in range(rounds)]
    ratio = [rep[c, r]["samples_per_s"] / rep["none-off", r]["samples_per_s"] for r in range(rounds)]
    mem = [rep[c, r]["memory"] for r in range(rounds)]
    state = [x["optimizer_state_mb"] for x in mem]
    base = [rep["none-off", r]["memory"]["optimizer_state_mb"] for r in range(rounds)]
    print(f"{c.replace('-', '/'):<16} {med(sps):>10.1f} {med(ratio):>8.3f} "
          f"{med([x['peak_mb'] for x in mem]):>8.0f} {med(state):>9.2f} "
          f"{med([s / b for s, b in zip(state, base)]):>8.3f} {med([x['rest_mb'] for x in mem]):>8.0f}")
PY
done

#!/usr/bin/env bash
# Benchmark, not a test: the batch search over the memory levers (Note [lever
# search]) against an exhaustive sweep of the same space, on CPU ranks of this
# machine. The GPT of tests/lever_search_e2e.sh (8 layers, 8 heads, width 128, 64
# tokens a sample; byte tokens of the GPL-3 Debian ships), AdamW, global batch
# G = 48 x W, so the per-GPU sizes are the divisors of 48 from 8: 8 12 16 24 48.
# For each world size W in RANKS:
#  1. calibrate: a plain max_fit search without a limit gives the peaks at per-GPU
#     16 and 48; the limit is 40 % of the way between them (plain fits 16 or 24);
#  2. the joint search (dist.shard: auto, model.recompute: auto) under that limit:
#     its choice, its time, and per combination the largest per-GPU batch it
#     predicted to fit and the largest it measured;
#  3. the sweep: every (shard, recompute) x every size (shard parameters included), one `search` of that single
#     candidate each (no limit: its peak and samples/s; search.max_time_s 4, so
#     each point gets search.timed_steps' 5 steps however slow), in SWEEP_ROUNDS
#     rotated rounds (median); a point fits when its peak is within the limit.
#  4. head to head: the search's choice and the sweep's best fitting point, each a
#     search of that one candidate timed for PAIR_STEPS steps, alternately (the
#     first of a pair swaps every round), PAIR_ROUNDS pairs: the sweep's best of 30
#     noisy points is biased upwards, and its rounds swing by more than 5 % here.
# Printed per W: the largest fitting size per combination, predicted (the search)
# against measured (the sweep); the search's choice against the sweep's best
# fitting point, in the sweep's rounds and head to head (median of the pairs'
# ratios: target >= 0.95); the search's seconds against the sweep's.
#
#   [RANKS="2 4"] [SWEEP_ROUNDS=2] [PAIR_ROUNDS=5] [PAIR_STEPS=10] \
#     bench/lever_search.sh [BATCHDIST_BIN] [OUT_DIR]
#     defaults: build/launcher/batchdist, a fresh mktemp -d
set -euo pipefail
bin=${1:-build/launcher/batchdist}
out=${2:-$(mktemp -d /tmp/lever_search.XXXXXX)}
ranks=${RANKS:-2 4} sweep_rounds=${SWEEP_ROUNDS:-2}
pair_rounds=${PAIR_ROUNDS:-5} pair_steps=${PAIR_STEPS:-10}
# shellcheck source=bench/gpt_tokens_lib.sh
source "$(dirname "$0")/gpt_tokens_lib.sh"
echo "lever_search: $(uptime | sed 's/.*load/load/'); out $out"
sizes=(8 12 16 24 48)
combos=("none off" "optimizer off" "gradients off" "parameters off"
  "none on" "optimizer on" "gradients on" "parameters on")

# search W NAME ARGS...: one `batchdist search` on W ranks into $out/NAME.
search() {
  local w=$1 name=$2; shift 2
  mpirun "${flags[@]}" -np "$w" "$bin" search "$(dirname "$0")/../configs/gpt-tiny.yaml" \
    --set data.path="$out/tokens/train.bin" --set data.val_path="$out/tokens/val.bin" \
    --set model.layers=8 --set model.heads=8 --set model.embed=128 --set model.seq_len=64 \
    --set batch.global=$((48 * w)) --set batch.per_gpu=auto --set optim.base_batch=$((48 * w)) \
    --set search.min=8 --set search.cache="$out/$name.cache.json" --output "$out/$name" --quiet \
    "$@" >"$out/$name.log" 2>&1 ||
    { echo "search $name failed: $out/$name.log" >&2; tail -5 "$out/$name.log" >&2; exit 1; }
}

for w in $ranks; do
  search "$w" "w$w-calibrate" --set search.objective=max_fit --set search.rounds=0 --set search.max=48
  limit=$(python3 - "$out/w$w-calibrate/search.json" <<'PY'
import json, sys
peak = {c["per_gpu_batch"]: c["peak_memory_mb"] for c in json.load(open(sys.argv[1]))["candidates"]
        if not c["failed"]}
print(int(peak[16] + 0.4 * (peak[48] - peak[16])))
PY
)
  search "$w" "w$w-joint" --set dist.shard=auto --set model.recompute=auto --set search.memory_limit_mb="$limit"
  sweep_t0=$SECONDS
  for ((r = 0; r < sweep_rounds; r++)); do
    for ((k = 0; k < ${#combos[@]}; k++)); do
      c=${combos[$(((k + r) % ${#combos[@]}))]}
      for m in "${sizes[@]}"; do
        search "$w" "w$w-r$r-${c/ /-}-$m" --set dist.shard="${c% *}" --set model.recompute="${c#* }" \
          --set search.min="$m" --set search.max="$m" --set search.max_time_s=4
      done
    done
  done
  sweep_s=$((SECONDS - sweep_t0))
  python3 - "$out" "$w" "$limit" "$sweep_rounds" "$sweep_s" "${sizes[*]}" >"$out/w$w-summary.txt" <<'PY'
import json, statistics, sys
out, w, limit, rounds, sweep_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
sizes = [int(x) for x in sys.argv[6].split()]
combos = [(s, r) for r in ("off", "on") for s in ("none", "optimizer", "gradients", "parameters")]
label = {c: " + ".join(x for x in ({"none": "", "optimizer": "shard optimizer",
                                    "gradients": "shard gradients",
                                    "parameters": "shard parameters"}[c[0]],
                                   "recompute" if c[1] == "on" else "") if x) or "plain"
         for c in combos}
def point(r, c, m):
    s = json.load(open(f"{out}/w{w}-r{r}-{c[0]}-{c[1]}-{m}/search.json"))
    k = s["candidates"][0]
    return k["samples_per_s"], k["peak_memory_mb"]
sweep = {(c, m): [point(r, c, m) for r in range(rounds)] for c in combos for m in sizes}
peak = {k: max(p for _, p in v) for k, v in sweep.items()}
sps = {k: statistics.median(s for s, _ in v) for k, v in sweep.items()}
joint = json.load(open(f"{out}/w{w}-joint/search.json"))
pred = {(o["levers"]["shard"], o["levers"]["recompute"]): o for o in joint["levers"]}
print(f"\nW={w}: limit {limit:.0f} MB per rank; sweep {rounds} rounds x {len(combos)} x {len(sizes)} points")
print(f"{'levers':<28} {'largest fit: predicted':>23} {'measured (sweep)':>17}   sweep samples/s by per-GPU {sizes}")
for c in combos:
    fit = [m for m in sizes if peak[c, m] <= limit]
    o = pred.get(c, {})
    row = " ".join(f"{sps[c, m]:.0f}{'' if peak[c, m] <= limit else '*'}" for m in sizes)
    print(f"{label[c]:<28} {o.get('predicted_max_per_gpu', 0):>23} {max(fit) if fit else 0:>17}   {row}")
print("  (* over the limit)")
chosen = [k for k in joint["candidates"] if k["chosen"]][0]
ck = ((chosen["levers"]["shard"], chosen["levers"]["recompute"]), chosen["per_gpu_batch"])
fits = [k for k in sweep if peak[k] <= limit]
best = max(fits, key=lambda k: sps[k])
ratios = [sweep[ck][r][0] / sweep[best][r][0] for r in range(rounds)]
print(f"search chose per-GPU {ck[1]} under {label[ck[0]]} in {joint['seconds']:.1f} s "
      f"({len(joint['candidates'])} measurements); the sweep's best fitting point: per-GPU {best[1]} under "
      f"{label[best[0]]}, {sps[best]:.0f} samples/s; the choice in the sweep: {sps[ck]:.0f} samples/s = "
      f"{statistics.median(ratios):.3f} of the best (per round: {', '.join(f'{x:.3f}' for x in ratios)}); "
      f"sweep {sweep_s:.0f} s")
with open(f"{out}/w{w}-pair.txt", "w") as f:
    for (shard, recompute), m in (ck, best):
        f.write(f"{shard} {recompute} {m}\n")
PY
  cat "$out/w$w-summary.txt"
  mapfile -t pair <"$out/w$w-pair.txt"
  if [ "${pair[0]}" = "${pair[1]}" ]; then
    echo "head to head: the search chose the sweep's best fitting point itself (1.000)"
    continue
  fi
  for ((r = 0; r < pair_rounds; r++)); do
    for k in $((r % 2)) $((1 - r % 2)); do
      read -r shard recompute m <<<"${pair[$k]}"
      search "$w" "w$w-pair$r-$k" --set dist.shard="$shard" --set model.recompute="$recompute" \
        --set search.min="$m" --set search.max="$m" --set search.timed_steps="$pair_steps" \
        --set search.max_time_s=60
    done
  done
  python3 - "$out" "$w" "$pair_rounds" "${pair[@]}" <<'PY'
import json, statistics, sys
out, w, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def sps(r, k):
    return json.load(open(f"{out}/w{w}-pair{r}-{k}/search.json"))["candidates"][0]["samples_per_s"]
ratios = [sps(r, 0) / sps(r, 1) for r in range(rounds)]
print(f"head to head ({rounds} pairs, the first of a pair alternating): the choice ({sys.argv[4]}) "
      f"{statistics.median(sps(r, 0) for r in range(rounds)):.0f} samples/s, the sweep's best "
      f"({sys.argv[5]}) {statistics.median(sps(r, 1) for r in range(rounds)):.0f}: "
      f"median ratio {statistics.median(ratios):.3f} (per pair: {', '.join(f'{x:.3f}' for x in ratios)})")
PY
done

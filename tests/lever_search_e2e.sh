#!/usr/bin/env bash
# Note [lever search] (worker/search/levers.h) end to end: the real binary, 2 real
# ranks, a GPT on CPU whose plain data parallelism fits a smaller per-GPU batch
# than recompute does under search.memory_limit_mb.
#
# usage: lever_search_e2e.sh MPIRUN "MPI FLAGS" BATCHDIST MAKE_DATA GPT_CONFIG OUTDIR
#  1. calibrate: a plain search (no limit) gives this machine's peaks at per-GPU 16
#     and 48 (G = 96: per-GPU sizes divide 48; resident memory: the CPU's stand-in
#     for GPU memory); the limit is set 40 % of the way from one to the other, so
#     plain fits 16 (or 24) and not 48 whatever the machine;
#  2. a search with dist.shard: auto and model.recompute: auto under that limit,
#     then 4 training steps: search.json has an outcome for each of the 8
#     combinations (parameters pruned), plain's largest fit is 16 or 24, recompute's predicted and
#     measured largest fit are above it (the prediction within one allowed size
#     of the measurement: sizes divide G/W = 48), the chosen candidate fits, and the run trained under the
#     chosen levers (report.json's shard and recompute, the console's line);
#  3. --resume auto on the same world: no search, the checkpoint's levers kept.
set -u
mpirun=$1 flags=$2 bin=$3 make_data=$4 config=$5 out=$6
rm -rf "$out"; mkdir -p "$out"
fail() { echo "FAIL: $*"; exit 1; }
"$make_data" tokens --text /usr/share/common-licenses/GPL-3 --out "$out/tokens" >/dev/null ||
  fail "could not make the tokens"

# run NAME VERB ARGS...: one bounded 2-rank run into $out/NAME.
run() {
  local name=$1 verb=$2; shift 2
  # shellcheck disable=SC2086
  timeout 400 "$mpirun" $flags -np 2 "$bin" "$verb" "$config" \
    --set data.path="$out/tokens/train.bin" --set data.val_path="$out/tokens/val.bin" \
    --set model.layers=8 --set model.heads=8 --set model.embed=64 --set model.seq_len=64 \
    --set batch.global=96 --set batch.per_gpu=auto --set optim.base_batch=96 \
    --set search.min=8 --set search.rounds=1 --set search.warmup_steps=1 \
    --set search.timed_steps=3 --set search.min_time_s=0.1 --set search.max_time_s=0.3 \
    --set checkpoint.every_minutes=0 --set report.tensorboard=false \
    --output "$out/$name" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] && return
  tail -20 "$out/$name.log"
  [ "$rc" -eq 124 ] && fail "$name ran past its 400 s"
  fail "$name exited $rc"
}

run calibrate search --set search.rounds=0 --set search.max=48 --set search.objective=max_fit
limit=$(python3 - "$out/calibrate/search.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
peak = {c["per_gpu_batch"]: c["peak_memory_mb"] for c in s["candidates"] if not c["failed"]}
if 16 not in peak or 48 not in peak:
    sys.exit(f"calibration measured {sorted(peak)}, not 16 and 48")
print(int(peak[16] + 0.4 * (peak[48] - peak[16])))
PY
) || fail "calibration: $limit"
echo "calibrate: plain peaks put the limit at $limit MB"

levers=(--set dist.shard=auto --set model.recompute=auto --set search.memory_limit_mb="$limit"
  --set train.epochs=100 --set checkpoint.every_steps=2)
run levers train "${levers[@]}" --set train.max_steps=4
python3 - "$out/levers" <<'PY' || fail "the lever search's figures"
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/search.json"))
r = json.load(open(f"{out}/report.json"))
outcomes = {(o["levers"]["shard"], o["levers"]["recompute"]): o for o in s["levers"]}
for o in s["levers"]:
    print(f'  {o["levers"]["shard"]}/{o["levers"]["recompute"]}: predicted {o["predicted_max_per_gpu"]}, '
          f'measured {o["measured_max_per_gpu"]}: {o["verdict"]}')
assert len(outcomes) == 8, outcomes.keys()  # none, optimizer, gradients, parameters x off, on
# A GPT of 0.4 M parameters saves nothing worth a gather per unit: parameters is
# predicted to fit no larger batch than another sharding did, and pruned unmeasured.
for rec in ("off", "on"):
    v = outcomes[("parameters", rec)]["verdict"]
    assert v.startswith("pruned: ") and "parameters would only cost time" in v, v
assert not any(c["levers"]["shard"] == "parameters" for c in s["candidates"]), "parameters was measured"
plain, rec = outcomes[("none", "off")], outcomes[("none", "on")]
m0 = plain["measured_max_per_gpu"]
assert m0 in (16, 24), plain
assert rec["predicted_max_per_gpu"] > m0 and rec["measured_max_per_gpu"] > m0, rec
pred, meas = rec["predicted_max_per_gpu"], rec["measured_max_per_gpu"]
# The allowed sizes (divisors of 48) are far apart: within one of them.
sizes = [m for m in range(8, 49) if 48 % m == 0]
assert abs(sizes.index(pred) - sizes.index(meas)) <= 1, (pred, meas)
chosen = [c for c in s["candidates"] if c["chosen"]]
assert len(chosen) == 1 and not chosen[0]["failed"], chosen
c = chosen[0]
assert c["peak_memory_mb"] <= s["memory_budget_mb"], c
assert (r["shard"], r["recompute"]) == (c["levers"]["shard"], c["levers"]["recompute"]), (r["shard"], r["recompute"], c["levers"])
assert r["per_gpu_batch"] == c["per_gpu_batch"] == s["chosen"], (r["per_gpu_batch"], c)
assert r["search"]["chosen_levers"] == c["levers"], r["search"]
print(f'chosen: per-GPU {c["per_gpu_batch"]} under {c["levers"]}, {c["samples_per_s"]:.0f} samples/s, '
      f'peak {c["peak_memory_mb"]:.0f} of {s["memory_budget_mb"]:.0f} MB')
PY
grep -q "levers: .* (the search's choice for dist.shard: auto and model.recompute: auto)" "$out/levers.log" ||
  fail "no levers line on the console"
grep -q "memory model (Note \[lever search\])" "$out/levers.log" || fail "no memory model in the table"

# A resume on the same world keeps the levers the checkpoint's run chose (no search).
cp -r "$out/levers" "$out/resumed"
run resumed train "${levers[@]}" --set train.max_steps=6 --resume auto
grep -q "(as the checkpoint's run chose for dist.shard: auto and model.recompute: auto)" "$out/resumed.log" ||
  fail "the resume does not say it keeps the checkpoint's levers"
grep -q "^batch search:" "$out/resumed.log" && fail "the resume searched again on the same world"
python3 - "$out" <<'PY' || fail "the resume's levers"
import json, sys
a = json.load(open(f"{sys.argv[1]}/levers/report.json"))
b = json.load(open(f"{sys.argv[1]}/resumed/report.json"))
assert (a["shard"], a["recompute"]) == (b["shard"], b["recompute"]), (a["shard"], a["recompute"], b["shard"], b["recompute"])
assert b["steps"] == 6 and b["resumed_from"]["step"] in (2, 4), (b["steps"], b.get("resumed_from"))
print(f'resumed at step {b["resumed_from"]["step"]} under {b["shard"]}/{b["recompute"]}, as the first run chose')
PY
echo "PASS"

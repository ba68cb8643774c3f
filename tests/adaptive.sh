#!/usr/bin/env bash
# The adaptive global batch with real ranks (Note [adaptive training] in
# worker/train/adapt/adaptive_batch.h): the quickstart with batch.adapt: goodput.
#
# usage: adaptive.sh MPIRUN "MPI FLAGS" BATCHDIST MODEL_DIFF CONFIG OUTDIR SCENARIO
#   ranks   3 ranks, rank 0's optimizer update 2 ms slower (BATCHDIST_FAULT_SLOW_UPDATE_US:
#           its steps and its fixed cost differ from the others'), a warmup of 45 steps
#           (past the first epoch's end, 29): no decision before it; G grows; every split
#           in batch_history is m x a x 3 within [G0, N / adapt_min_steps]; one console
#           line per change; no rank decided otherwise than rank 0; metrics.jsonl's
#           progress rises to the plan's end; parameters agree (train.check_finite)
#   resume  2 ranks; a run's checkpoint after its first change, resumed on the same
#           world: the same final model bit for bit, the same history, steps, progress
#   world   the same checkpoint resumed on 3 ranks (G0 = 48): the split is planned
#           for 3 ranks, the history before the resume kept, the run ends at the
#           same G0-equivalent budget
#   world_fixed  the same with batch.per_gpu: 8 (no search, so G grows by accumulation
#           and the samples/s come from the run's own steps): on 3 ranks G is kept by
#           accumulation where 8 x 3 divides it, else the line says batch.per_gpu 8
#           does not split it; every split after the resume has per-GPU batch 8
#   oom     an out-of-memory at step 80, after G grew, halves m under the adaptive G; no later
#           decision goes back to the per-GPU batch that failed
#   in_warmup  2 ranks, the same 45-step warmup with batch.adapt_in_warmup: true and a
#           decision every 10 steps: G changes before the warmup's end, the run completes
#   figures 2 ranks on pinned figures, rank 1 started without them
#           (BATCHDIST_FAULT_ADAPT_FIGURES=1): it says that its decision differed and
#           takes rank 0's; history, steps and model.pt those of the run without it
#   linear  2 ranks, batch.adapt_gain: linear: every lr_gain is G / G0, the run ends at
#           the plan's samples (within one step), no step's lr above the peak x G / G0
#   warmup  2 ranks, batch.adapt: warmup from G0 = 16 (Note [batch-size warmup]), a
#           decision every 10 steps after the lr warmup: the run completes, G grows;
#           every G in batch_history is G0 x 2^k, never smaller than the one before;
#           at each change the B_simple the decision recorded is >= the new G and the
#           line says batch-size warmup; metrics.jsonl's G never falls; one console
#           line per change
#
# Every scenario but world_fixed decides on pinned samples/s figures (pin below), so
# that G grows where it needs to, and takes them back from the search cache.
set -u
mpirun=$1 flags=$2 bin=$3 diff=$4 cfg=$5 out=$6 scenario=$7
rm -rf "$out"; mkdir -p "$out"
. "$(dirname "$0")/mpi_job_lib.sh"

# run NAME NP ARGS...: one batchdist run into $out/NAME (log in $out/NAME.log); sets rc.
run() {
  run_into "$@"
  grep -aE '^(adapt|resume|done|oom)' "$out/$1.log" | head -n 12
}

# check NAME WORLD G0 [FROM_STEP [IN_WARMUP]]: report.json and metrics.jsonl of an
# adaptive run; IN_WARMUP 1: G must change during the warmup (else it must not).
check() {
  python3 - "$out/$1" "$2" "$3" "${4:-0}" "${5:-0}" <<'EOF' || fail "$1: see above"
import json, sys
d, world, g0, from_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
in_warmup = sys.argv[5] == "1"
r = json.load(open(d + "/report.json"))
def need(ok, what):
    if not ok:
        print("FAIL:", what); sys.exit(1)
need(r["completed"], "run not completed")
h = r["batch_history"]
total = r["plan"]["total_steps"]
ceiling = 1438 // 8
need(h[0]["step"] == 0 and h[0]["global_batch"] == g0, f"history does not start at G0 {g0}: {h[0]}")
warmup = r["plan"]["warmup_steps"]
early = [c for c in h[1:] if c["step"] < warmup]
if in_warmup:
    need(any("->" in c["why"] for c in early), f"G did not change in the warmup ({warmup} steps): {h}")
else:
    need(not early, f"decided during the warmup ({warmup} steps): {early}")
for c in h:
    if c["step"] < from_step:
        continue
    g, m, a = c["global_batch"], c["per_gpu_batch"], c["accum"]
    need(g == m * a * world, f"{c}: not m x a x {world}")
    need(g0 <= g <= ceiling, f"{c}: outside [{g0}, {ceiling}]")
need(any(c["global_batch"] > g0 for c in h), "G never grew")
steps = [c["step"] for c in h]
need(steps == sorted(steps), f"history not in step order: {steps}")
p = r["progress"]
gain = h[-1]["lr_gain"]
need(total <= p < total + gain + 1e-9, f"progress {p} does not end at the budget {total}")
need(r["eval_accuracy"] > 0.9, f"eval accuracy {r['eval_accuracy']}")
lines = [json.loads(l) for l in open(d + "/metrics.jsonl")]
prog = [l["progress"] for l in lines]
need(all(b >= a for a, b in zip(prog, prog[1:])), "metrics.jsonl progress goes back")
need(abs(prog[-1] - p) < 1e-6, f"last metrics progress {prog[-1]} != report {p}")
seen = {l["global_batch"] for l in lines}
need(seen <= {c["global_batch"] for c in h}, f"metrics G {seen} not in the history")
changes = sum(1 for c in h if "->" in c["why"])
print(f"{d.split('/')[-1]}: {len(h)} history entries, {changes} changes, G {sorted(seen)}, "
      f"{r['steps']} steps, progress {p:.1f} of {total}, accuracy {100 * r['eval_accuracy']:.2f} %")
open(d + "/changes", "w").write(str(changes))
EOF
}

adapt=(--set batch.adapt=goodput --set batch.per_gpu=auto --set train.progress=off)
nocache=(--set search.cache="")

# [np=N] pin NAME ARGS...: the batch search for `batchdist ARGS...` on N ranks (2),
# its cache entry's samples/s replaced by a fixed curve (a rank's step takes 1 ms +
# 10 us a sample: on 2 ranks 24 per GPU 38.7k samples/s, 88 per GPU 93.6k) with no
# uncertainty. A run
# given "${pinned[@]}" (--set search.cache=$out/NAME.cache.json, which pin sets)
# takes it back (a cache hit, which took_pin LOG asserts), so
# its decisions rest on B alone, which the seed fixes: measured samples/s on a busy
# machine carry an uncertainty that keeps G within the margin for a varying number
# of decisions (Note [goodput]), and whether G grows by a given step varied.
pin() {
  local name=$1; shift
  # shellcheck disable=SC2086
  "$mpirun" $flags -np "${np:-2}" "$bin" search "$cfg" --output "$out/$name-search" "$@" \
    --set search.cache="$out/$name.cache.json" >"$out/$name-search.log" 2>&1 ||
    { tail -n 20 "$out/$name-search.log"; fail "$name: the search for the pinned cache failed"; }
  python3 - "$out/$name.cache.json" "${np:-2}" <<'PY' || fail "$name: cache not pinned"
import json, sys
path, world = sys.argv[1], int(sys.argv[2])
d = json.load(open(path))
r = d["result"]
n = 0
for c in r["candidates"] + r["adapt_range"]:
    if c["failed"]:
        continue
    sps = world * c["per_gpu_batch"] / (1e-3 + 1e-5 * c["per_gpu_batch"])
    c["samples_per_s"] = c["ci_low"] = c["ci_high"] = sps
    c["round_samples_per_s"] = []
    n += 1
if not r["adapt_range"]:
    print("FAIL: the search measured no adapt range"); sys.exit(1)
json.dump(d, open(path, "w"))
print(f"pinned {n} samples/s figures in {path}; largest per-GPU batch "
      f"{max(c['per_gpu_batch'] for c in r['adapt_range'])}")
PY
  pinned=(--set search.cache="$out/$name.cache.json")
}

# took_pin NAME: the run logged in $out/NAME.log took its figures from the cache.
took_pin() {
  grep -q "^batch search: cached result for this model" "$out/$1.log" ||
    fail "$1: the run did not take the pinned cache"
}

case "$scenario" in
  ranks)
    # MPMD: rank 0 slower in every update, on pinned figures (its fixed cost is
    # still its own, and the ranks share it through the allreduce).
    args=("${adapt[@]}" --set batch.global=48 --set train.check_finite=true --set optim.warmup_steps=45)
    np=3 pin ranks "${args[@]}"
    args+=("${pinned[@]}")
    # shellcheck disable=SC2086
    "$mpirun" $flags -np 1 -x BATCHDIST_FAULT_SLOW_UPDATE_US=2000 "$bin" "$cfg" --output "$out/ranks" "${args[@]}" : \
      -np 2 "$bin" "$cfg" --output "$out/ranks" "${args[@]}" >"$out/ranks.log" 2>&1
    rc=$?
    grep -aE '^(adapt|done)' "$out/ranks.log" | head -n 12
    [ "$rc" = 0 ] || { tail -n 20 "$out/ranks.log"; fail "exit $rc"; }
    took_pin ranks
    check ranks 3 48
    ! grep -a "warning: rank [0-9]*: the adaptive batch decision" "$out/ranks.log" ||
      fail "a rank decided otherwise than rank 0 from the same figures"
    lines=$(grep -c '^adapt: step' "$out/ranks.log")
    [ "$lines" = "$(cat "$out/ranks/changes")" ] ||
      fail "$lines 'adapt: step' lines for $(cat "$out/ranks/changes") changes (rank 0 alone prints)"
    ;;
  resume | world | world_fixed)
    base=("${adapt[@]}" --set batch.global=48 --set model.dropout=0.1
          --set checkpoint.every_steps=10 --set checkpoint.keep=100)
    if [ "$scenario" = world_fixed ]; then
      # adapt_max 96: the 2-rank run grows to 64, 80 or 96; 96 = 8 x 4 x 3 is kept on 3.
      base+=(--set batch.per_gpu=8 --set batch.adapt_max=96 "${nocache[@]}")
    else
      # The 2-rank runs take the pinned figures; the 3-rank run searches (another key).
      pin full "${base[@]}"
      base+=("${pinned[@]}")
    fi
    run full 2 "${base[@]}"; [ "$rc" = 0 ] || fail "uninterrupted run: exit $rc"
    [ "$scenario" = world_fixed ] || took_pin full
    check full 2 48
    # Every checkpoint's manifest says where the adaptive run stood, not where the
    # plan at G0 would have been.
    python3 - "$out/full/checkpoints" <<'EOF' || fail "manifest"
import json, os, sys
d = sys.argv[1]
steps = sorted(n for n in os.listdir(d) if n.startswith("step-"))
if not steps:
    print("FAIL: no checkpoint in", d); sys.exit(1)
for name in steps:
    m = json.load(open(os.path.join(d, name, "manifest.json")))
    a = m["adapt"]
    for k in ("epoch", "step_in_epoch"):
        if m[k] != a[k]:
            print(f"FAIL: {name}: manifest {k} {m[k]}, the adaptive run's {a[k]}"); sys.exit(1)
print(f"{len(steps)} manifests: epoch and step_in_epoch the adaptive run's")
EOF
    # The first checkpoint after the first change of G.
    first=$(python3 -c "import json,sys; h=json.load(open(sys.argv[1]))['batch_history']; \
print(next(c['step'] for c in h if '->' in c['why']))" "$out/full/report.json")
    at=$(( (first / 10 + 1) * 10 ))
    ckpt=$(printf "%s/full/checkpoints/step-%08d" "$out" "$at")
    [ -d "$ckpt" ] || fail "no checkpoint at step $at (first change at step $first)"
    echo "first change at step $first; resuming from $ckpt"
    if [ "$scenario" = resume ]; then
      run resumed 2 "${base[@]}" --resume "$ckpt"
      [ "$rc" = 0 ] || fail "resumed run: exit $rc"
      grep -q "resume: continuing from $ckpt" "$out/resumed.log" || fail "did not resume from $ckpt"
      check resumed 2 48
      python3 - "$out/full/report.json" "$out/resumed/report.json" <<'EOF' || fail "reports differ"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for k in ("steps", "samples", "progress", "eval_accuracy", "eval_loss", "train_loss"):
    if a[k] != b[k]:
        print(f"FAIL: {k}: {a[k]} uninterrupted, {b[k]} resumed"); sys.exit(1)
strip = lambda h: [{k: v for k, v in c.items() if k != "why"} for c in h]
if strip(a["batch_history"]) != strip(b["batch_history"]):
    print("FAIL: batch_history differs:", a["batch_history"], b["batch_history"]); sys.exit(1)
print(f"resumed == uninterrupted: steps {a['steps']}, progress {a['progress']}, "
      f"{len(a['batch_history'])} history entries")
EOF
      "$diff" "$out/full/model.pt" "$out/resumed/model.pt" 0 || fail "model.pt differs after the resume"
    else
      run other 3 "${base[@]}" --resume "$ckpt"
      [ "$rc" = 0 ] || fail "resumed run on 3 ranks: exit $rc"
      check other 3 48 "$at"
      python3 - "$out/full/report.json" "$out/other/report.json" "$at" <<'EOF' || fail "history lost"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
at = int(sys.argv[3])
before = lambda r: [(c["step"], c["global_batch"], c["per_gpu_batch"], c["accum"])
                    for c in r["batch_history"] if c["step"] < at]
if before(a) != before(b):
    print("FAIL: history before the resume:", before(a), before(b)); sys.exit(1)
print(f"2 -> 3 ranks at step {at}: history before it kept ({len(before(a))} entries)")
EOF
      if [ "$scenario" = world_fixed ]; then
        python3 - "$out/full/report.json" "$out/other/report.json" "$at" "$out/other.log" <<'EOF' || fail "fixed per-GPU batch"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
at, log = int(sys.argv[3]), open(sys.argv[4], errors="replace").read()
g = [c["global_batch"] for c in a["batch_history"] if c["step"] < at][-1]
after = [c for c in b["batch_history"] if c["step"] >= at]
bad = [c for c in after if c["per_gpu_batch"] != 8]
if bad:
    print("FAIL: a split after the resume is not per-GPU 8:", bad); sys.exit(1)
moved = "adapt: resumed on 3 ranks" in log
if g % 24 == 0 and moved:
    print(f"FAIL: G {g} splits as 8 x {g // 24} x 3 but was not kept"); sys.exit(1)
if g % 24 != 0 and "does not split over them with batch.per_gpu 8" not in log:
    print(f"FAIL: G {g} does not split over 3 ranks at per-GPU 8 and the line does not say so"); sys.exit(1)
print(f"G {g} at the checkpoint: {'re-planned' if moved else 'kept'} on 3 ranks with per-GPU 8")
EOF
      fi
    fi
    ;;
  oom)
    # Rank 1 runs out of memory at step 80, after decisions every 10 steps from the
    # warmup's end (step 30) on the pinned figures, which grow G before it: m halves,
    # G stays; no later decision returns to that m.
    args=("${adapt[@]}" --set batch.global=48 --set batch.adapt_every_steps=10)
    pin oom "${args[@]}"
    flags="$flags -x BATCHDIST_FAULT_OOM=1:80" run oom 2 "${args[@]}" "${pinned[@]}"
    [ "$rc" = 0 ] || { tail -n 20 "$out/oom.log"; fail "exit $rc"; }
    took_pin oom
    python3 -c 'import json, sys
h = json.load(open(sys.argv[1]))["batch_history"]
sys.exit(0 if any("->" in c["why"] and c["step"] < 79 for c in h) else 1)' "$out/oom/report.json" ||
      fail "G did not grow before step 80, so the out-of-memory was not under an adaptive G"
    check oom 2 48
    python3 - "$out/oom/report.json" <<'EOF' || fail "back-off"
import json, sys
r = json.load(open(sys.argv[1]))
b = r["oom_backoffs"]
if len(b) != 1 or b[0]["step"] != 80:
    print("FAIL: back-offs:", b); sys.exit(1)
b = b[0]
g_before = b["from_per_gpu"] * b["from_accum"] * 2
if b["to_per_gpu"] * b["to_accum"] * 2 != g_before or b["to_per_gpu"] * 2 != b["from_per_gpu"]:
    print("FAIL: the back-off did not halve m under G", g_before, b); sys.exit(1)
later = [c for c in r["batch_history"] if c["step"] >= 80 and c["per_gpu_batch"] >= b["from_per_gpu"]]
if later:
    print("FAIL: went back to per-GPU batch", b["from_per_gpu"], later); sys.exit(1)
print(f"back-off at step 80: {b['from_per_gpu']} x {b['from_accum']} -> {b['to_per_gpu']} x "
      f"{b['to_accum']} under G {g_before}")
EOF
    ;;
  in_warmup)
    args=("${adapt[@]}" --set batch.global=48 --set optim.warmup_steps=45 --set batch.adapt_every_steps=10
          --set batch.adapt_in_warmup=true --set train.check_finite=true)
    pin warm "${args[@]}"
    run warm 2 "${args[@]}" "${pinned[@]}"
    [ "$rc" = 0 ] || { tail -n 20 "$out/warm.log"; fail "exit $rc"; }
    took_pin warm
    check warm 2 48 0 1
    grep -q "^adapt: .*re-decided every 10 steps and at epoch ends (in the warmup's 45 steps too: batch.adapt_in_warmup)" \
      "$out/warm.log" || fail "the adapt line does not say that it decides in the warmup"
    ;;
  figures)
    # Rank 1 starts with no samples/s figures (as a cache hit once left it): it
    # decides otherwise, says so, and takes rank 0's split; the run is the one
    # made without the fault, bit for bit.
    args=("${adapt[@]}" --set batch.global=48 --set batch.adapt_every_steps=10
          --set train.check_finite=true)
    pin same "${args[@]}"
    run same 2 "${args[@]}" "${pinned[@]}"
    [ "$rc" = 0 ] || { tail -n 20 "$out/same.log"; fail "run without the fault: exit $rc"; }
    took_pin same
    check same 2 48
    flags="$flags -x BATCHDIST_FAULT_ADAPT_FIGURES=1" run skew 2 "${args[@]}" "${pinned[@]}"
    [ "$rc" = 0 ] || { tail -n 20 "$out/skew.log"; fail "run with rank 1's figures gone: exit $rc"; }
    took_pin skew
    check skew 2 48
    grep -aE "^batchdist: warning: rank 1: the adaptive batch decision at step [0-9]+ was global batch [0-9]+ \([0-9]+ x [0-9]+ x 2\), rank 0's [0-9]+ \([0-9]+ x [0-9]+ x 2\): taking rank 0's, in this decision and any later one that differs \(this rank's samples/s figures differ from rank 0's\)$" \
      "$out/skew.log" || fail "rank 1 did not say that it took rank 0's decision"
    [ "$(grep -ac "warning: rank 1: the adaptive" "$out/skew.log")" = 1 ] || fail "rank 1 said it more than once"
    ! grep -aq "warning: rank 0: the adaptive" "$out/skew.log" || fail "rank 0 warned"
    python3 - "$out/same/report.json" "$out/skew/report.json" <<'EOF' || fail "reports differ"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
if a["batch_history"] != b["batch_history"]:
    print("FAIL: batch_history differs:", a["batch_history"], b["batch_history"]); sys.exit(1)
for k in ("steps", "progress", "eval_accuracy", "train_loss"):
    if a[k] != b[k]:
        print(f"FAIL: {k}: {a[k]} without the fault, {b[k]} with it"); sys.exit(1)
print(f"with rank 1's figures gone: the same {len(a['batch_history'])} history entries, steps, progress")
EOF
    "$diff" "$out/same/model.pt" "$out/skew/model.pt" 0 || fail "model.pt differs with rank 1's figures gone"
    ;;
  linear)
    args=("${adapt[@]}" --set batch.global=48 --set batch.adapt_every_steps=10
          --set batch.adapt_gain=linear --set train.check_finite=true)
    pin lin "${args[@]}"
    run lin 2 "${args[@]}" "${pinned[@]}"
    [ "$rc" = 0 ] || { tail -n 20 "$out/lin.log"; fail "exit $rc"; }
    took_pin lin
    check lin 2 48
    grep -q "^adapt: .* G0-equivalent steps (a step at G counts G/G0 of them, the lr scales with G/G0: batch.adapt_gain: linear)" \
      "$out/lin.log" || fail "the adapt line does not say that the gain is linear"
    python3 - "$out/lin" <<'EOF' || fail "lin: see above"
import json, sys
d = sys.argv[1]
r = json.load(open(d + "/report.json"))
h, g0 = r["batch_history"], r["batch_history"][0]["global_batch"]
bad = [c for c in h if abs(c["lr_gain"] - c["global_batch"] / g0) > 1e-12]
if bad:
    print("FAIL: lr_gain is not G / G0:", bad); sys.exit(1)
# The budget is the plan's samples: the run stops at the first step that reaches it.
ends = [c["step"] for c in h[1:]] + [r["steps"]]
samples = sum((e - c["step"]) * c["global_batch"] for c, e in zip(h, ends))
budget = r["plan"]["total_steps"] * g0
if not budget <= samples < budget + h[-1]["global_batch"]:
    print(f"FAIL: {samples} samples, the budget is {budget}"); sys.exit(1)
# The lr is the G0 schedule's times G / G0: never above the plan's peak x G / G0.
peak = r["plan"]["lr"]
for l in map(json.loads, open(d + "/metrics.jsonl")):
    if l.get("kind") == "step" and l["lr"] > peak * l["global_batch"] / g0 * (1 + 1e-9):
        print("FAIL: lr", l["lr"], "above", peak, "x", l["global_batch"], "/", g0); sys.exit(1)
print(f"lin: lr_gain G/G0 in all {len(h)} entries; {samples} samples for a budget of {budget}")
EOF
    ;;
  warmup)
    # Batch-size warmup: G follows B_simple by doublings of G0 = 16 (16, 32, 64, 128
    # under the data's ceiling 1438 / 8 = 179), whatever the samples/s say; the
    # pinned figures only choose each G's split.
    args=(--set batch.adapt=warmup --set batch.per_gpu=auto --set train.progress=off
          --set batch.global=16 --set batch.adapt_every_steps=10 --set train.check_finite=true)
    pin warmup "${args[@]}"
    run warmup 2 "${args[@]}" "${pinned[@]}"
    [ "$rc" = 0 ] || { tail -n 20 "$out/warmup.log"; fail "exit $rc"; }
    took_pin warmup
    check warmup 2 16
    grep -q "^adapt: batch.adapt: warmup: global batch from 16 up to 179, doubled as B_simple reaches G0 x 2^k, re-decided every 10 steps" \
      "$out/warmup.log" || fail "the adapt line does not say batch-size warmup"
    lines=$(grep -c '^adapt: step' "$out/warmup.log")
    [ "$lines" = "$(cat "$out/warmup/changes")" ] ||
      fail "$lines 'adapt: step' lines for $(cat "$out/warmup/changes") changes (rank 0 alone prints)"
    python3 - "$out/warmup" 16 <<'EOF' || fail "warmup: see above"
import json, sys
d, g0 = sys.argv[1], int(sys.argv[2])
r = json.load(open(d + "/report.json"))
h = r["batch_history"]
def need(ok, what):
    if not ok:
        print("FAIL:", what); sys.exit(1)
def k_of(g):  # G = G0 x 2^k: k, else None
    q, rem = divmod(g, g0)
    return q.bit_length() - 1 if rem == 0 and q > 0 and q & (q - 1) == 0 else None
ks = [k_of(c["global_batch"]) for c in h]
need(None not in ks, f"a global batch is not G0 x 2^k: {[c['global_batch'] for c in h]}")
need(all(b >= a for a, b in zip(ks, ks[1:])), f"G shrank: {[c['global_batch'] for c in h]}")
changes = [(p, c) for p, c in zip(h, h[1:]) if c["global_batch"] != p["global_batch"]]
need(changes, "G never changed")
for p, c in changes:
    b = c["noise_scale"]
    need(b is not None and b >= c["global_batch"],
         f"step {c['step']}: G {p['global_batch']} -> {c['global_batch']} with B_simple {b}")
    need("(batch-size warmup)" in c["why"], f"step {c['step']}: the line does not say so: {c['why']}")
gs = [json.loads(l)["global_batch"] for l in open(d + "/metrics.jsonl")]
need(all(b >= a for a, b in zip(gs, gs[1:])), "metrics.jsonl's global batch falls")
print("warmup: G " + " -> ".join(f"{c['global_batch']} (step {c['step']}, B {c['noise_scale']:.0f})"
                                 for _, c in changes) + f", from {g0}")
EOF
    ;;
  *) fail "unknown scenario $scenario" ;;
esac
echo "PASS $scenario"

#!/usr/bin/env bash
# Benchmark, not a test: the optimizer's share of a GPT training step on CPU
# ranks, per optim.kernels (Note [multi-tensor step], Note [fused optimizer
# steps]). A GPT (Note [gpt]) on byte-level tokens of the GPL-3 Debian ships,
# AdamW with clipping, trained STEPS steps at per-GPU batch M under each of
# KERNELS; the profiler traces steps 6-8 of each run (Note [step profiler]) and
# bench/trace_phases.py gives the optimizer phase's share of those steps. ROUNDS
# rounds, the kernels in a rotated order each round; printed: medians of
# samples/s, step time and the optimizer's share and time, and each one's
# samples/s against per_tensor's in the same round (median of the ratios).
#
#   [RANKS=1] [ROUNDS=3] [M=8] [STEPS=20] [KERNELS="per_tensor multi_tensor fused"]
#   [GPT_SHAPE="LAYERS HEADS EMBED SEQ_LEN"] bench/optimizer_share.sh [BATCHDIST_BIN] [OUT_DIR]
#     defaults: build/launcher/batchdist, a fresh mktemp -d; GPT_SHAPE "6 4 256 128"
#     (fused runs as multi_tensor where the LibTorch has no fused kernels: the
#     run's model: line says which ran)
set -euo pipefail
bin=${1:-build/launcher/batchdist}
out=${2:-$(mktemp -d /tmp/optimizer_share.XXXXXX)}
w=${RANKS:-1} rounds=${ROUNDS:-3} m=${M:-8} steps=${STEPS:-20}
read -r -a kernels <<<"${KERNELS:-per_tensor multi_tensor fused}"
read -r layers heads embed seq <<<"${GPT_SHAPE:-6 4 256 128}"
# shellcheck source=bench/gpt_tokens_lib.sh
source "$(dirname "$0")/gpt_tokens_lib.sh"
echo "optimizer_share: $(uptime | sed 's/.*load/load/'); gpt ${layers}x${heads}x${embed}, seq $seq; W=$w, M=$m, $steps steps; out $out"

run() {  # run KERNELS NAME
  mpirun "${flags[@]}" -np "$w" "$bin" train "$(dirname "$0")/../configs/gpt-tiny.yaml" \
    --set data.path="$out/tokens/train.bin" --set data.val_path="$out/tokens/val.bin" \
    --set model.layers="$layers" --set model.heads="$heads" --set model.embed="$embed" \
    --set model.seq_len="$seq" --set batch.global=$((m * w)) --set batch.per_gpu="$m" \
    --set optim.base_batch=$((m * w)) --set optim.kernels="$1" --set train.max_steps="$steps" \
    --set train.epochs=1000 --set profile.wait=5 --set profile.warmup=1 --set profile.active=3 \
    --set checkpoint.every_minutes=0 --set checkpoint.on_signal=false \
    --set report.tensorboard=false --output "$out/$2" >"$out/$2.log" 2>&1 ||
    { echo "run $2 failed: $out/$2.log" >&2; tail -5 "$out/$2.log" >&2; exit 1; }
  python3 "$(dirname "$0")/trace_phases.py" --json "$out/$2/profile" >"$out/$2.phases.json"
}

for ((r = 0; r < rounds; r++)); do
  for ((k = 0; k < ${#kernels[@]}; k++)); do
    kern=${kernels[$(((k + r) % ${#kernels[@]}))]}
    run "$kern" "r$r-$kern"
  done
done
python3 - "$out" "$rounds" "${kernels[@]}" <<'PY'
import json, re, statistics, sys
out, rounds, kernels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
rep = {(k, r): json.load(open(f"{out}/r{r}-{k}/report.json")) for k in kernels for r in range(rounds)}
ph = {(k, r): json.load(open(f"{out}/r{r}-{k}.phases.json")) for k in kernels for r in range(rounds)}
def ran(k):
    log = open(f"{out}/r0-{k}.log").read()
    m = re.search(r"optimizer step (\w+)", log)
    return m.group(1) if m else "?"
print(f"{rounds} rounds, medians; ratio: samples/s against {kernels[0]} of the same round")
print(f"{'optim.kernels':<14} {'ran':<13} {'samples/s':>10} {'x':>6} {'step ms':>8} {'optimizer %':>12} {'optimizer ms':>13}")
for k in kernels:
    sps = [rep[k, r]["samples_per_s"] for r in range(rounds)]
    ratio = [rep[k, r]["samples_per_s"] / rep[kernels[0], r]["samples_per_s"] for r in range(rounds)]
    step_ms = [ph[k, r]["median"]["ms"] for r in range(rounds)]
    share = [ph[k, r]["median"]["optimizer"] for r in range(rounds)]
    print(f"{k:<14} {ran(k):<13} {med(sps):>10.1f} {med(ratio):>6.2f} {med(step_ms):>8.1f} "
          f"{100 * med(share):>11.1f}% {med([a * b for a, b in zip(step_ms, share)]):>13.2f}")
PY

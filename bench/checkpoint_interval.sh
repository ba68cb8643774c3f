#!/usr/bin/env bash
# Benchmark, not a test: what checkpoints cost the training steps at each interval,
# written in the foreground and in the background (Note [background checkpoint]),
# and the interval checkpoint.every_steps: auto picks (Note [checkpoint interval]).
#
# The job: an MLP 64-2048-2048-10 (4.3 M parameters; a checkpoint with SGD momentum
# is ~34 MiB) on the embedded digits, 2 ranks, 1 thread each, per-GPU batch 64 (G = 128), a
# fixed number of steps (train.max_steps). For each setting the training phase's
# wall time (phases.json "train": steps, checkpoints and their waits, evaluation)
# is divided by the steps; the ratio is against the same job without periodic
# checkpoints, measured in the same rounds. Settings are interleaved round by
# round (--rounds, default 3); the table shows medians.
#   bash bench/checkpoint_interval.sh [--rounds N] [--steps S] [--bin BATCHDIST]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/build/launcher/batchdist rounds=3 steps=120
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "no batchdist at $bin: build it first (README)" >&2; exit 2; }
out=$(mktemp -d /tmp/batchdist-ckpt-interval.XXXXXX)
flags="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && flags="$flags --allow-run-as-root"
settings=("off" "1 fg" "1 bg" "5 fg" "5 bg" "20 fg" "20 bg" "auto bg")
echo "uptime: $(uptime)"
echo "output: $out"

run() {  # run ROUND SETTING
  local name every mode
  every=${2%% *} mode=${2##* }
  name="r$1-${every}-${mode}"
  local sets=(--set "model.hidden=[2048,2048]" --set model.batchnorm=false --set batch.per_gpu=64 --set batch.global=128
              --set train.max_steps="$steps" --set train.epochs=100 --set train.threads=1
              --set train.progress=off --set checkpoint.keep=2 --set train.noise_scale=false)
  if [ "$every" != off ]; then
    sets+=(--set checkpoint.every_steps="$every" --set checkpoint.background="$([ "$mode" = bg ] && echo true || echo false)")
  fi
  # shellcheck disable=SC2086
  mpirun $flags -np 2 "$bin" "$here/configs/quickstart.yaml" --output "$out/$name" "${sets[@]}" \
    >"$out/$name.log" 2>&1 || { tail -n 20 "$out/$name.log"; exit 1; }
}

for r in $(seq 1 "$rounds"); do
  for s in "${settings[@]}"; do run "$r" "$s"; done
  echo "round $r done"
done

python3 - "$out" "$rounds" "${settings[@]}" <<'PY'
import json, statistics, sys, re, glob, os
out, rounds, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def name(r, s):
    every, mode = s.split(" ")[0], s.split(" ")[-1]
    return f"{out}/r{r}-{every}-{mode}"
rows = {}
for s in settings:
    per_step, waits, writes, counts, picked = [], [], [], [], set()
    for r in range(1, rounds + 1):
        d = name(r, s)
        ph = json.load(open(f"{d}/phases.json"))
        rep = json.load(open(f"{d}/report.json"))
        per_step.append(ph["train"] / rep["steps"])
        cps = [c for c in rep["checkpoints"] if "error" not in c]
        counts.append(len(cps))
        waits += [c["seconds"] for c in cps]
        writes += [c.get("write_seconds", 0) for c in cps]
        for m in re.finditer(r"every (\d+) step\(s\)", open(f"{d}.log").read()):
            picked.add(int(m.group(1)))
    rows[s] = (statistics.median(per_step), waits, writes, statistics.median(counts), picked)
base = rows["off"][0]
size = None
for f in glob.glob(f"{out}/r1-1-fg/report.json"):
    size = json.load(open(f))["checkpoints"][0]["bytes"] / 2**20
print(f"\nMLP 64-2048-2048-10, 2 ranks, {json.load(open(name(1, 'off') + '/report.json'))['steps']} steps; a checkpoint is {size:.1f} MiB")
print("| every_steps | written | checkpoints | step wait (median) | write (median) | s per step | vs no checkpoints |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for s in settings:
    ps, waits, writes, n, picked = rows[s]
    every, mode = s.split(" ")[0], s.split(" ")[-1]
    label = every if every != "auto" else f"auto (picked {', '.join(map(str, sorted(picked)))})"
    w = f"{statistics.median(waits):.3f} s" if waits else "-"
    wr = f"{statistics.median(writes):.3f} s" if writes else "-"
    print(f"| {label} | {'-' if every == 'off' else ('background' if mode == 'bg' else 'foreground')} | {n:.0f} | {w} | {wr} | {ps:.4f} | {ps / base:.3f}x |")
PY

#!/usr/bin/env bash
# GPU acceptance: the one script to run on a node with NVIDIA GPUs to see that
# batchdist works there and how fast. It builds the CUDA leg (tests/cuda_leg.sh:
# LibTorch 2.x wheel, CUDA, NCCL), then on 1 GPU and on all GPUs of the node:
#   1. quickstart      configs/quickstart.yaml over NCCL on the GPUs (accuracy >= 0.9)
#   2. resnet50-P      configs/resnet50-synthetic.yaml with batch.per_gpu: auto, for
#                      P = fp32, bf16, fp16: the search table, the chosen batch, peak
#                      memory against the search.memory_fraction budget (90 % of the
#                      GPU), the out-of-memory boundary, images/s and the data-stall
#                      fraction (report.json time_breakdown.data_wait_fraction)
#   3. ddp-P           PyTorch DDP (torchrun from the same venv, same model, per-GPU
#                      batch and precision; bench/ddp_baseline.py), and the ratio
#                      batchdist images/s / DDP images/s
#   4. adaptive        configs/adaptive-wide.yaml with batch.adapt: goodput (on 1 GPU
#                      per-GPU 16 x accumulation 2, for the noise scale): the global
#                      batch's history (G at the end, the decisions), accuracy and
#                      samples/s; it passes when the run ends with a batch_history,
#                      whether G moved or not (that is a measurement)
# and writes one JSON summary, OUT/summary.json, again after every step (a run cut
# short still reports what it measured). Exit code: 0 every step passed (or was
# skipped for the budget), 1 a step failed (the summary says which, each step's
# log is in OUT), 2 bad arguments, 3 no GPU found.
#
#   bench/gpu_acceptance.sh [--out DIR] [--gpus N] [--precisions "fp32 bf16 fp16"]
#                           [--samples N] [--steps N] [--build-dir DIR] [--skip-build]
#                           [--leg-tests] [--venv DIR] [--budget-s S] [--dry-run]
#   bench/gpu_acceptance.sh --summarize OUT
#     --gpus N      use N GPUs for the "all GPUs" runs (default: every visible one)
#     --samples N   synthetic images, so the search can reach out-of-memory [50000]
#     --steps N     training steps per run, and timed DDP steps [60]
#     --skip-build  use the existing BUILD_DIR/launcher/batchdist and venv
#     --leg-tests   also run the CUDA leg's ctest selection after building
#     --venv DIR    the Python environment with torch and torchrun (DDP, the summary)
#                   [the CUDA leg's venv: tests/cuda_leg.sh --venv]
#     --budget-s S  finish within S seconds: a step that would not fit in what is
#                   left (by its estimate) is skipped and recorded as skipped, and a
#                   running step is stopped at the deadline [no limit]
#     --dry-run     find the GPUs, print the plan, run nothing
#     --summarize   (re)write OUT/summary.json from the outputs of an earlier run
# Environment: NVIDIA_SMI [nvidia-smi], CUDA_VISIBLE_DEVICES (respected).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
out="$PWD/gpu-acceptance-$(date +%Y%m%d-%H%M%S)"
gpus_wanted=""
precisions="fp32 bf16 fp16"
samples=50000
steps=60
build="$src/build-cuda"
skip_build=0
leg_tests=0
dry_run=0
summarize_only=""
venv_arg=""
budget=""

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
bad() { echo "gpu_acceptance.sh: $*; see --help" >&2; exit 2; }
need_value() { if [ $# -lt 2 ] || [ -z "$2" ]; then bad "$1 needs a value"; fi; }
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

while [ $# -gt 0 ]; do
  case $1 in
    --out) need_value "$@"; out=$2; shift 2 ;;
    --gpus) need_value "$@"; is_count "$2" || bad "--gpus: expected a count >= 1, got '$2'"; gpus_wanted=$2; shift 2 ;;
    --precisions) need_value "$@"; precisions=$2; shift 2 ;;
    --samples) need_value "$@"; is_count "$2" || bad "--samples: expected a count >= 1, got '$2'"; samples=$2; shift 2 ;;
    --steps) need_value "$@"; is_count "$2" || bad "--steps: expected a count >= 1, got '$2'"; steps=$2; shift 2 ;;
    --build-dir) need_value "$@"; build=$2; shift 2 ;;
    --skip-build) skip_build=1; shift ;;
    --leg-tests) leg_tests=1; shift ;;
    --venv) need_value "$@"; venv_arg=$2; shift 2 ;;
    --budget-s) need_value "$@"; is_count "$2" || bad "--budget-s: expected seconds >= 1, got '$2'"; budget=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --summarize) need_value "$@"; summarize_only=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) bad "unknown argument '$1'" ;;
  esac
done
for p in $precisions; do
  case $p in fp32|bf16|fp16) ;; *) bad "--precisions: '$p' is not fp32, bf16 or fp16" ;; esac
done
[ -n "$precisions" ] || bad "--precisions: empty"
case $build in /*) ;; *) build="$PWD/$build" ;; esac
deadline=""
[ -n "$budget" ] && deadline=$(( $(date +%s) + budget ))

# --- summary: OUT/summary.json from steps.tsv and each step's outputs ----------
summarize() {
  local py=python3
  [ -n "${venv:-}" ] && py="$venv/bin/python"
  "$py" - "$1" <<'PY'
import csv, json, os, re, sys

out = sys.argv[1]
def text(name, default="unknown"):
    try:
        return open(os.path.join(out, name)).read().strip()
    except OSError:
        return default
version, gpus, host, gpu = text("version.txt"), int(text("gpus.txt", "0")), text("host.txt"), text("gpu.txt")
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

steps = list(csv.DictReader(open(os.path.join(out, "steps.tsv")), delimiter="\t"))
runs = {}
for s in steps:
    run = runs.setdefault(int(s["world"]), {"world_size": int(s["world"])})
    d, name, ok = s["dir"], s["step"], s["code"] == "0"
    if s["code"] == "skipped":
        run[name] = {"ok": True, "skipped": True, "why": "did not fit in the time budget (--budget-s)"}
        continue
    entry = {"ok": ok, "exit_code": int(s["code"]), "seconds": int(s["seconds"]), "log": os.path.join(d, "log")}
    if s["code"] == "124":
        entry["problem"] = "stopped at the time budget's deadline (--budget-s)"
    if name == "quickstart":
        r = load(os.path.join(d, "report.json")) or {}
        entry.update({k: r.get(k) for k in ("backend", "device", "eval_accuracy", "samples_per_s")})
        if ok and not (r.get("backend") == "nccl" and (r.get("eval_accuracy") or 0) >= 0.9):
            entry.update(ok=False, problem="expected backend nccl and eval_accuracy >= 0.9")
    elif name.startswith("resnet50-"):
        r, sj = load(os.path.join(d, "report.json")) or {}, load(os.path.join(d, "search.json")) or {}
        cands = sj.get("candidates", [])
        fits = [c["per_gpu_batch"] for c in cands if not c["failed"]]
        oom = [c["per_gpu_batch"] for c in cands if c["failed"] and c["reason"] != "error"]
        chosen = next((c for c in cands if c.get("chosen")), {})
        budget = sj.get("memory_budget_mb")
        entry.update({
            "chosen_per_gpu_batch": sj.get("chosen"), "why": sj.get("why"),
            "search_seconds": sj.get("seconds"), "search_timed_steps": sj.get("timed_steps"),
            "search_table": [{k: c[k] for k in ("per_gpu_batch", "samples_per_s", "peak_memory_mb", "failed", "reason")} for c in cands],
            "peak_memory_mb": chosen.get("peak_memory_mb"), "memory_budget_mb": budget,
            "gpu_memory_mb": (r.get("memory") or {}).get("total_mb"),
            "peak_vs_budget": chosen.get("peak_memory_mb") / budget if budget and chosen.get("peak_memory_mb") else None,
            "largest_fitting_batch": max(fits) if fits else None,
            "oom_boundary_batch": min(oom) if oom else None,
            "images_per_s": r.get("samples_per_s"),
            "data_wait_fraction": (r.get("time_breakdown") or {}).get("data_wait_fraction"),
            "train_loss": r.get("train_loss"),
        })
        if ok and not cands:
            entry.update(ok=False, problem="no search.json candidates")
    elif name == "adaptive":
        r = load(os.path.join(d, "report.json")) or {}
        hist = r.get("batch_history") or []
        entry.update({k: r.get(k) for k in ("backend", "device", "eval_accuracy", "samples_per_s", "progress")})
        entry.update({"global_batch_start": hist[0]["global_batch"] if hist else None,
                      "global_batch_end": r.get("global_batch"),
                      "decisions": [h.get("why") for h in hist[1:] if "->" in (h.get("why") or "")]})
        if ok and not (r.get("backend") == "nccl" and hist):
            entry.update(ok=False, problem="expected backend nccl and a batch_history in report.json")
    elif name.startswith("ddp-"):
        try:
            m = re.findall(r"samples_per_s ([0-9.]+)", open(entry["log"]).read())
        except OSError:
            m = []
        entry["images_per_s"] = float(m[-1]) if m else None
        if ok and not m:
            entry.update(ok=False, problem="no samples_per_s in the DDP log")
    run[name] = entry
for run in runs.values():
    for key in [k for k in run if k.startswith("resnet50-") and not run[k].get("skipped")]:
        p = key.split("-", 1)[1]
        a, b = run[key].get("images_per_s"), run.get("ddp-" + p, {}).get("images_per_s")
        run[key]["ddp_images_per_s"] = b
        run[key]["vs_ddp"] = round(a / b, 3) if a and b else None
failed = [f"world {w} {k}" for w, run in runs.items() for k, v in run.items() if isinstance(v, dict) and not v["ok"]]
skipped = [f"world {w} {k}" for w, run in runs.items() for k, v in run.items() if isinstance(v, dict) and v.get("skipped")]
summary = {"host": host, "gpus": gpus, "gpu": gpu, "batchdist": version,
           "ok": not failed, "failed_steps": failed, "skipped_steps": skipped,
           "runs": [runs[w] for w in sorted(runs)]}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
for run in summary["runs"]:
    for k, v in run.items():
        if k.startswith("resnet50-") and v["ok"] and not v.get("skipped"):
            print(f"world {run['world_size']} {k}: batch {v['chosen_per_gpu_batch']}/GPU, "
                  f"{v['images_per_s'] or 0:.0f} img/s ({v['vs_ddp']} x DDP), peak {v['peak_memory_mb'] or 0:.0f} of "
                  f"{v['memory_budget_mb'] or 0:.0f} MB budget, OOM at {v['oom_boundary_batch']}, "
                  f"data wait {100 * (v['data_wait_fraction'] or 0):.1f} %")
for run in summary["runs"]:
    v = run.get("adaptive")
    if v and v["ok"] and not v.get("skipped"):
        print(f"world {run['world_size']} adaptive: global batch {v['global_batch_start']} -> "
              f"{v['global_batch_end']} ({len(v['decisions'])} change(s)), accuracy "
              f"{100 * (v['eval_accuracy'] or 0):.2f} %, {v['samples_per_s'] or 0:.0f} samples/s")
verdict = "PASSED" if not failed else "FAILED: " + ", ".join(failed)
if skipped:
    verdict += f" ({len(skipped)} step(s) skipped for the time budget: {', '.join(skipped)})"
print(f"gpu_acceptance: {verdict}; {os.path.join(out, 'summary.json')}")
sys.exit(1 if failed else 0)
PY
}
[ -n "$summarize_only" ] && { summarize "$summarize_only"; exit; }

# --- GPUs: the driver's list, narrowed by CUDA_VISIBLE_DEVICES ---------------------
no_gpu() {
  echo "gpu_acceptance.sh: no GPU found: $*. This script measures batchdist on NVIDIA GPUs;" \
       "on a machine without one, tests/cuda_leg.sh builds and tests the CUDA build on the CPU." >&2
  exit 3
}
smi=${NVIDIA_SMI:-nvidia-smi}
command -v "$smi" >/dev/null 2>&1 || no_gpu "'$smi' is not installed (no NVIDIA driver on $(hostname))"
listed=$("$smi" -L 2>/dev/null | grep -c '^GPU ' || true)
[ "$listed" -gt 0 ] || no_gpu "'$smi -L' lists no GPU on $(hostname)"
gpus=$listed
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c -E '^ *([0-9]+|GPU-|MIG-)' || true)
  [ "$visible" -gt 0 ] || no_gpu "CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES' hides all $listed GPU(s)"
  [ "$visible" -lt "$gpus" ] && gpus=$visible
fi
if [ -n "$gpus_wanted" ]; then
  [ "$gpus_wanted" -le "$gpus" ] || bad "--gpus $gpus_wanted, but only $gpus GPU(s) are visible"
  gpus=$gpus_wanted
fi
worlds="1"
[ "$gpus" -gt 1 ] && worlds="1 $gpus"

echo "gpu_acceptance: $gpus GPU(s) on $(hostname); world sizes: $worlds; precisions: $precisions"
echo "  build: $build ($([ $skip_build = 1 ] && echo "existing" || echo "tests/cuda_leg.sh$([ $leg_tests = 1 ] || echo " --no-tests")"))"
echo "  output: $out"
[ -n "$budget" ] && echo "  budget: $budget s (a step that would not fit is skipped)"
for w in $worlds; do
  echo "  world $w: quickstart (nccl); $(for p in $precisions; do printf 'resnet50-%s ddp-%s; ' "$p" "$p"; done)adaptive"
done
[ "$dry_run" = 1 ] && exit 0

# --- build ---------------------------------------------------------------------------
mkdir -p "$out"
if [ "$skip_build" = 0 ]; then
  leg_args=(--build-dir "$build")
  [ "$leg_tests" = 1 ] || leg_args+=(--no-tests)
  if ! "$src/tests/cuda_leg.sh" "${leg_args[@]}" 2>&1 | tee "$out/build.log"; then
    printf '{"host": "%s", "gpus": %s, "ok": false, "failed_steps": ["build"], "log": "%s"}\n' \
      "$(hostname)" "$gpus" "$out/build.log" >"$out/summary.json"
    echo "gpu_acceptance: FAILED: build (tests/cuda_leg.sh); $out/build.log" >&2
    exit 1
  fi
fi
bin="$build/launcher/batchdist"
[ -x "$bin" ] || { echo "gpu_acceptance.sh: no $bin (drop --skip-build)" >&2; exit 1; }
if [ -n "$venv_arg" ]; then
  venv=$venv_arg
  [ -x "$venv/bin/python" ] || { echo "gpu_acceptance.sh: --venv $venv has no bin/python" >&2; exit 2; }
else
  venv=$("$src/tests/cuda_leg.sh" --venv)
fi
py="$venv/bin/python"
mpi_flags=(--bind-to none)
[ "$(id -u)" = 0 ] && mpi_flags+=(--allow-run-as-root)

# Each step: its command, exit code, seconds and log, one line of steps.tsv.
printf 'world\tstep\tcode\tseconds\tdir\n' >"$out/steps.tsv"
"$bin" --version >"$out/version.txt"
hostname >"$out/host.txt"
echo "$gpus" >"$out/gpus.txt"
"$smi" --query-gpu=name,memory.total --format=csv,noheader | head -n 1 >"$out/gpu.txt" || true
# Under --budget-s a step runs only when its estimate fits in what is left, and is
# stopped (exit 124) at the deadline; the summary is rewritten after every step.
estimate() {  # seconds a step takes on one node, roughly (searches dominate)
  case $1 in
    quickstart) echo 30 ;;
    resnet50-*) echo $(( 60 + steps + samples / 1000 )) ;;
    ddp-*) echo $(( 30 + steps / 2 )) ;;
    adaptive) echo 90 ;;
    *) echo 60 ;;
  esac
}
skip_step() {
  printf '%s\t%s\tskipped\t0\t%s\n' "$1" "$2" "$out/w$1/$2" >>"$out/steps.tsv"
  echo "== world $1, $2: skipped ($3)"
  summarize "$out" >/dev/null 2>&1 || true
}
step() {
  local w=$1 name=$2 dir="$out/w$1/$2"; shift 2
  local t0 code=0 limit=()
  if [ -n "$deadline" ]; then
    local left=$(( deadline - $(date +%s) ))
    if [ "$left" -lt "$(estimate "$name")" ]; then
      skip_step "$w" "$name" "${left} s left of the budget, it needs about $(estimate "$name") s"
      return 0
    fi
    limit=(timeout --kill-after=10 "$left")
  fi
  mkdir -p "$dir"
  t0=$(date +%s)
  echo "== world $w, $name: $*" | tee "$dir/log"
  "${limit[@]}" "$@" >>"$dir/log" 2>&1 || code=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$w" "$name" "$code" "$(( $(date +%s) - t0 ))" "$dir" >>"$out/steps.tsv"
  if [ "$code" = 0 ]; then echo "   ok"; else echo "   FAILED (exit $code), log: $dir/log"; fi
  summarize "$out" >/dev/null 2>&1 || true
}
# Fields of a JSON file, for the commands that need them (the chosen batch).
json_get() { "$py" -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v[int(k)] if isinstance(v, list) else v[k]
print(v)' "$1" "$2"; }

for w in $worlds; do
  step "$w" quickstart mpirun "${mpi_flags[@]}" -np "$w" "$bin" "$src/configs/quickstart.yaml" -q \
    --set train.device=cuda --set dist.backend=nccl --output "$out/w$w/quickstart"
  for p in $precisions; do
    step "$w" "resnet50-$p" mpirun "${mpi_flags[@]}" -np "$w" "$bin" "$src/configs/resnet50-synthetic.yaml" \
      --set batch.per_gpu=auto --set train.precision="$p" --set train.device=cuda \
      --set dist.backend=nccl --set data.samples="$samples" --set train.max_steps="$steps" \
      --output "$out/w$w/resnet50-$p"
    if [ "$(tail -n 1 "$out/steps.tsv" | cut -f3)" = skipped ]; then
      skip_step "$w" "ddp-$p" "resnet50-$p was skipped, and its search picks DDP's batch"
      continue
    fi
    chosen=$(json_get "$out/w$w/resnet50-$p/search.json" chosen 2>/dev/null || echo 64)
    step "$w" "ddp-$p" "$venv/bin/torchrun" --standalone --nproc_per_node "$w" "$here/ddp_baseline.py" \
      --model resnet50 --device cuda --precision "$p" --per-gpu-batch "$chosen" --classes 100 \
      --steps "$steps" --warmup 5
  done
  # Note [goodput]: one rank measures the noise scale only across micro-batches.
  split=(--set batch.per_gpu=auto)
  [ "$w" = 1 ] && split=(--set batch.per_gpu=16)
  step "$w" adaptive mpirun "${mpi_flags[@]}" -np "$w" "$bin" "$src/configs/adaptive-wide.yaml" -q \
    --set batch.adapt=goodput "${split[@]}" --set train.device=cuda --set dist.backend=nccl \
    --output "$out/w$w/adaptive"
done

summarize "$out"

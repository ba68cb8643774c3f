#!/usr/bin/env bash
# GPU acceptance: the one script to run on a node with NVIDIA GPUs to see that
# batchdist works there and how fast. It builds the CUDA leg (tests/cuda_leg.sh:
# LibTorch 2.x wheel, CUDA, NCCL), then runs these steps, the most valuable first
# (P0 is bf16, or the first of --precisions without it), on 1 GPU and, with more
# GPUs, again on all of them (the steps marked * on 1 GPU only):
#   quickstart     configs/quickstart.yaml over NCCL (accuracy >= 0.9)
#   resume*        checkpoint at step 100, SIGKILL, --resume auto, on the GPU (quickstart
#                  with dropout: the CUDA RNG): model.pt compared with the uninterrupted
#                  run's, tensor by tensor, bitwise (bench/gpu_resume_check.sh)
#   unit-tests*    the CUDA build's `ctest -L cuda_leg` with the GPU visible, stopped
#                  after 150 s: counts of passed, failed, crashed (a signal: SegFault,
#                  abort) and skipped tests, the failed ones named
#   resnet50-P0    configs/resnet50-synthetic.yaml with batch.per_gpu: auto and
#                  train.memory_format: contiguous: the search table, the chosen
#                  batch, peak memory against the search.memory_fraction budget (90 %
#                  of the GPU), the out-of-memory boundary, images/s, MFU
#                  (report.json mfu, flops_per_sample, peak_tflops) and the data-stall
#                  fraction (time_breakdown.data_wait_fraction); its system metrics
#                  (NVML, CPU) and diagnosis, and a profiler trace of steps 13-15 with
#                  each phase's share of them and the GPU's busy share
#                  (bench/trace_phases.py: trace_phases.json)
#   ddp-P0         PyTorch DDP (torchrun from the same venv, same model, per-GPU batch,
#                  precision and memory format; bench/ddp_baseline.py), and the ratio
#                  batchdist images/s / DDP images/s, DDP's MFU
#   trace          that trace, read again (bench/gpu_trace_check.py): GPU kernel events,
#                  NCCL kernels (none on 1 GPU, which is said, not failed) and NVML's
#                  metrics in metrics.jsonl not zero (utilisation, memory, power)
#   resnet50-P0-cl, ddp-P0-cl   the same pair in channels_last on both sides
#                  (train.memory_format: channels_last; ddp_baseline.py --channels-last)
#   gpt2-P0        configs/gpt2-small.yaml (124 M parameters, seq 1024, SDPA, no
#                  compile) at a fixed per-GPU batch (--gpt-batch) on random token
#                  windows: tokens/s, MFU, peak memory
#   ddp-gpt2-P0    bench/gpt_model.py's GPT-2 small under PyTorch DDP at the same batch
#                  (SDPA, no torch.compile, AdamW and clipping as the config): tokens/s,
#                  MFU, and the ratio
#   levers         `batchdist search` of GPT-2 small with dist.shard and model.recompute
#                  auto at 4 x --gpt-batch per GPU, under a search.memory_fraction that
#                  leaves plain data parallel 7/8 of gpt2-P0's activations (so it fits
#                  only smaller batches and recompute is weighed; --lever-fraction sets
#                  it): the choice, each combination's predicted and measured largest
#                  batch; it passes when recompute was weighed
#   resnet50-fp16-cl, ddp-fp16-cl   the pair in fp16 (its loss scaler: scale and
#                  skipped steps), when --precisions has fp16
#   optimizer-step* builds and runs bench/optimizer_step.cc on the GPU
#                  (batchdist_optimizer_step 1 15 cuda): torch::optim's step against
#                  batchdist's per-tensor and multi-tensor steps, GPT-2 small's adamw and
#                  ResNet-50's sgd, medians and ratios
#   oom*           a real CUDA out-of-memory in training: ResNet-50 at P0 with a fixed
#                  per-GPU batch twice the largest that fit in resnet50-P0's search
#                  (--oom-batch N); the back-off (batch and accumulation before and
#                  after), whether the run finished, images/s after it
#   resnet50-P-cl, ddp-P-cl   the other precisions of --precisions (fp32)
#   photos*        an image folder of JPEG photos made here (bench/gpu_photos.py:
#                  bench/photo_folder.py, scikit-image's photos at 300-600 px; class
#                  patterns from batchdist_make_data where there are no photos;
#                  --photos-from says which)
#   pipeline*      ResNet-50 bf16 from that folder (configs/resnet50-imagenet.yaml),
#                  data.workers: auto: images/s, data_wait_fraction, loader threads
#   data-verb*     `batchdist data` on the same folder alone, on (cores - 1) threads:
#                  images/s the decoder delivers without a model
#   gloo2*         2 ranks on one GPU over Gloo (dist.backend gloo, train.device cuda;
#                  NCCL refuses two ranks on a device): accuracy and samples/s
#   adaptive       configs/adaptive-wide.yaml with batch.adapt: goodput (on 1 GPU
#                  per-GPU 16 x accumulation 2, for the noise scale): the global
#                  batch's history (G at the end, the decisions), accuracy and
#                  samples/s; it passes when the run ends with a batch_history,
#                  whether G moved or not (that is a measurement)
# and writes one JSON summary, OUT/summary.json, again after every step (a run cut
# short still reports what it measured). Exit code: 0 every step passed (or was
# skipped), 1 a step failed (the summary says which, each step's log is in OUT),
# 2 bad arguments, 3 no GPU found.
#
#   bench/gpu_acceptance.sh [--out DIR] [--gpus N] [--precisions "fp32 bf16 fp16"]
#                           [--samples N] [--steps N] [--photos N] [--oom-batch N]
#                           [--gpt-batch N] [--lever-fraction F]
#                           [--photos-from auto|photos|patterns]
#                           [--build-dir DIR] [--skip-build] [--leg-tests] [--venv DIR]
#                           [--budget-s S] [--dry-run]
#   bench/gpu_acceptance.sh --summarize OUT
#     --gpus N      use N GPUs for the "all GPUs" runs (default: every visible one)
#     --samples N   synthetic images, so the search can reach out-of-memory [50000]
#     --steps N     training steps per run, and timed DDP steps [40]
#     --photos N    photos the pipeline step decodes [1024]
#     --photos-from S  photos: real photos or the photos step fails; patterns: class
#                   patterns, whatever this machine has; auto: photos where the
#                   venv's Python (or /usr/bin/python3) has PIL, numpy and
#                   scikit-image's photos, else patterns [auto]
#     --oom-batch N the per-GPU batch of the oom step [twice the largest that fit in
#                   the search; without a search, 1.5 x what the GPU's memory holds
#                   by a rule of thumb]
#     --gpt-batch N the per-GPU batch (windows of 1024 tokens) of gpt2 and its DDP [16]
#     --lever-fraction F  the levers step's search.memory_fraction [7/8 of the way
#                   from gpt2-P0's fixed memory to its peak, over the GPU's memory;
#                   without that run 12000 MB over it]
#     --skip-build  use the existing BUILD_DIR/launcher/batchdist and venv
#     --leg-tests   also run the CUDA leg's ctest selection when building (on the CPU)
#     --venv DIR    the Python environment with torch and torchrun (DDP, the summary)
#                   [the CUDA leg's venv: tests/cuda_leg.sh --venv]
#     --budget-s S  finish within S seconds: the first step that would not fit in
#                   what is left (by its estimate, a pair's by both; --dry-run prints
#                   them and what S would cut) is skipped, and so is the rest of that
#                   world's plan (the tail), each recorded as skipped; a running step
#                   is stopped at the deadline [no limit]
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
steps=40
photos=1024
gpt_batch=16
lever_fraction=""
photos_from=auto
oom_batch=""
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
    --photos) need_value "$@"; is_count "$2" || bad "--photos: expected a count >= 1, got '$2'"; photos=$2; shift 2 ;;
    --photos-from) need_value "$@"
      case $2 in auto|photos|patterns) photos_from=$2 ;; *) bad "--photos-from: '$2' is not auto, photos or patterns" ;; esac
      shift 2 ;;
    --oom-batch) need_value "$@"; is_count "$2" || bad "--oom-batch: expected a count >= 1, got '$2'"; oom_batch=$2; shift 2 ;;
    --gpt-batch) need_value "$@"; is_count "$2" || bad "--gpt-batch: expected a count >= 1, got '$2'"; gpt_batch=$2; shift 2 ;;
    --lever-fraction) need_value "$@"
      [[ $2 =~ ^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$ ]] || bad "--lever-fraction: expected a fraction in (0, 1], got '$2'"
      lever_fraction=$2; shift 2 ;;
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
read -r -a plist <<<"$precisions"
for p in "${plist[@]}"; do
  case $p in fp32|bf16|fp16) ;; *) bad "--precisions: '$p' is not fp32, bf16 or fp16" ;; esac
done
[ "${#plist[@]}" -gt 0 ] || bad "--precisions: empty"
precisions="${plist[*]}"
# P0, the precision measured first (and by the oom step): bf16 unless left out.
primary=bf16
[[ " $precisions " == *" bf16 "* ]] || primary=${plist[0]}
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
def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
BUDGET = "did not fit in the time budget (--budget-s)"

def model_figures(r):
    """report.json's figures of the model's arithmetic (absent keys: None)."""
    return {"memory_format": r.get("memory_format"), "mfu": r.get("mfu"),
            "flops_per_sample": r.get("flops_per_sample"), "peak_tflops": r.get("peak_tflops"),
            "peak_source": r.get("peak_source")}

def lever_label(levers):
    if not levers:
        return None
    shard, rc = levers.get("shard", "none"), levers.get("recompute", "off")
    parts = ([] if shard == "none" else [f"shard {shard}"]) + (["recompute"] if rc == "on" else [])
    return " + ".join(parts) or "plain"

def resnet50(entry, d, ok):
    r, sj = load(os.path.join(d, "report.json")) or {}, load(os.path.join(d, "search.json")) or {}
    cands = sj.get("candidates", [])
    fits = [c.get("per_gpu_batch") for c in cands if not c.get("failed")]
    oom = [c.get("per_gpu_batch") for c in cands if c.get("failed") and c.get("reason") != "error"]
    chosen = next((c for c in cands if c.get("chosen")), {})
    budget = sj.get("memory_budget_mb")
    entry.update({
        "chosen_per_gpu_batch": sj.get("chosen"), "why": sj.get("why"),
        "search_seconds": sj.get("seconds"), "search_timed_steps": sj.get("timed_steps"),
        "search_table": [{k: c.get(k) for k in ("per_gpu_batch", "samples_per_s", "peak_memory_mb", "failed", "reason")} for c in cands],
        "peak_memory_mb": chosen.get("peak_memory_mb"), "memory_budget_mb": budget,
        "gpu_memory_mb": (r.get("memory") or {}).get("total_mb"),
        "peak_vs_budget": chosen.get("peak_memory_mb") / budget if budget and chosen.get("peak_memory_mb") else None,
        "largest_fitting_batch": max(fits) if fits else None,
        "oom_boundary_batch": min(oom) if oom else None,
        "images_per_s": r.get("samples_per_s"),
        "data_wait_fraction": (r.get("time_breakdown") or {}).get("data_wait_fraction"),
        "train_loss": r.get("train_loss"),
        # Note [system metrics], Note [step profiler]: what the GPU did meanwhile.
        "system": [dict(rank=x.get("rank"), host=x.get("host"), unread=x.get("unread"), **(x.get("run") or {}))
                   for x in (r.get("system") or {}).get("ranks", [])],
        "trace_phases": (load(os.path.join(d, "trace_phases.json")) or {}).get("median"),
        "diagnosis": r.get("diagnosis"),
        **model_figures(r),
    })
    if r.get("loss_scaler"):  # fp16: Note [loss scaling]
        entry.update(loss_scale=r["loss_scaler"].get("scale"), skipped_steps=r["loss_scaler"].get("skipped_steps"))
    if ok and not cands:
        entry.update(ok=False, problem="no search.json candidates")

def quickstart(entry, d, ok):
    r = load(os.path.join(d, "report.json")) or {}
    entry.update({k: r.get(k) for k in ("backend", "device", "eval_accuracy", "samples_per_s")})
    if ok and not (r.get("backend") == "nccl" and (r.get("eval_accuracy") or 0) >= 0.9):
        entry.update(ok=False, problem="expected backend nccl and eval_accuracy >= 0.9")

def adaptive(entry, d, ok):
    r = load(os.path.join(d, "report.json")) or {}
    hist = r.get("batch_history") or []
    entry.update({k: r.get(k) for k in ("backend", "device", "eval_accuracy", "samples_per_s", "progress")})
    entry.update({"global_batch_start": hist[0]["global_batch"] if hist else None,
                  "global_batch_end": r.get("global_batch"),
                  "decisions": [h.get("why") for h in hist[1:] if "->" in (h.get("why") or "")]})
    if ok and not (r.get("backend") == "nccl" and hist):
        entry.update(ok=False, problem="expected backend nccl and a batch_history in report.json")

def ddp(entry, d, ok):
    log = read(entry["log"])
    def last(pattern):
        m = re.findall(pattern, log, re.M)
        return m[-1] if m else None
    sps = last(r"^samples_per_s ([0-9.]+)")
    entry["samples_per_s"] = float(sps) if sps else None
    if not os.path.basename(d).startswith("ddp-gpt2-"):
        entry["images_per_s"] = entry["samples_per_s"]
    tps, mfu, flops = last(r"^tokens_per_s ([0-9.]+)"), last(r"^mfu ([0-9.]+)"), last(r"^flops_per_sample ([0-9.e+]+)")
    peak = re.findall(r"^peak_tflops ([0-9.]+) \((.*)\)$", log, re.M)
    entry.update({"tokens_per_s": float(tps) if tps else None, "mfu": float(mfu) if mfu else None,
                  "flops_per_sample": float(flops) if flops else None,
                  "peak_tflops": float(peak[-1][0]) if peak else None, "peak_source": peak[-1][1] if peak else None})
    unknown = last(r"^mfu unknown \((.*)\)$")
    if unknown:
        entry["mfu_note"] = unknown
    if ok and not sps:
        entry.update(ok=False, problem="no samples_per_s in the DDP log")

def gpt2(entry, d, ok):
    r = load(os.path.join(d, "report.json")) or {}
    m = r.get("memory") or {}
    entry.update({k: r.get(k) for k in ("precision", "per_gpu_batch", "accum_steps", "tokens_per_step",
                                         "samples_per_s", "tokens_per_s", "train_loss", "recompute", "shard")})
    entry.update({"tokens_per_sample": (r.get("plan") or {}).get("tokens_per_sample"),
                  "peak_memory_mb": m.get("peak_mb"), "gpu_memory_mb": m.get("total_mb"),
                  "memory_parts_mb": {k: m.get(k) for k in ("parameters_mb", "gradients_mb", "optimizer_state_mb",
                                                            "rest_mb")},
                  **model_figures(r)})
    if ok and r.get("tokens_per_s") is None:
        entry.update(ok=False, problem="no tokens_per_s in report.json")

def levers(entry, d, ok):
    sj, req = load(os.path.join(d, "search.json")) or {}, load(os.path.join(d, "request.json")) or {}
    outcomes = sj.get("levers") or []
    cands = sj.get("candidates") or []
    on = [o for o in outcomes if (o.get("levers") or {}).get("recompute") == "on"]
    weighed = any(o.get("fitted") or o.get("timed") or (o.get("predicted_max_per_gpu") or 0) > 0 for o in on)
    plain_fit = [c.get("per_gpu_batch") for c in cands
                 if not c.get("failed") and lever_label(c.get("levers")) in ("plain", None)]
    rc_max = max([o.get("measured_max_per_gpu") or 0 for o in on] or [0])
    entry.update({
        "memory_fraction": req.get("memory_fraction"), "limit_mb": req.get("limit_mb"),
        "why_this_fraction": req.get("why"), "memory_budget_mb": sj.get("memory_budget_mb"),
        "chosen_per_gpu_batch": sj.get("chosen"), "chosen_accum": sj.get("chosen_accum"),
        "chosen_levers": lever_label(sj.get("chosen_levers")), "why": sj.get("why"),
        "search_seconds": sj.get("seconds"),
        "outcomes": [dict(levers=lever_label(o.get("levers")),
                          **{k: o.get(k) for k in ("predicted_max_per_gpu", "measured_max_per_gpu", "timed", "verdict")})
                     for o in outcomes],
        "candidates": [dict(levers=lever_label(c.get("levers")),
                            **{k: c.get(k) for k in ("per_gpu_batch", "accum_steps", "samples_per_s",
                                                     "peak_memory_mb", "failed", "reason")})
                       for c in cands],
        "largest_plain_fit": max(plain_fit) if plain_fit else None,
        "recompute_weighed": weighed,
        "recompute_fits_larger": bool(plain_fit and rc_max > max(plain_fit)) if on else None,
    })
    if ok and not cands:
        entry.update(ok=False, problem="no search.json candidates")
    elif ok and not weighed:
        why = "; ".join(o.get("verdict") or "" for o in on) or "no recompute outcome in search.json"
        entry.update(ok=False, problem=f"recompute was not weighed ({why}): memory did not bound plain data "
                                       f"parallel at search.memory_fraction {req.get('memory_fraction')} "
                                       "(--lever-fraction sets it)")

def trace(entry, d, ok):
    t = load(os.path.join(d, "trace_check.json")) or {}
    entry.update({k: t.get(k) for k in ("trace", "steps", "kernels", "kernel_names", "memcpy", "nccl_kernels",
                                         "nccl_kernel_names", "nccl_events", "nccl_event_names", "nccl_note",
                                         "nvml", "nvml_points", "nvml_source", "nvml_nonzero")})
    if t.get("problems"):
        entry["problem"] = "; ".join(t["problems"])
    if ok and not t:
        entry.update(ok=False, problem="no trace_check.json")

def optimizer_step(entry, d, ok):
    # bench/optimizer_step.cc's lines: "adamw 148 tensors 124.4 M params: torch::optim 4.1 ms;
    # [batchdist ]per-tensor 4.0 ms (1.01x), multi-tensor 1.6 ms (2.50x); median of 15", each
    # kernel's time and ratio to the baseline (its first), ";" or "," between them.
    log = read(entry["log"])
    head = re.search(r"^optimizer step, width / (\d+), (\S+), torch threads (\d+)", log, re.M)
    entry["device"] = head.group(2).rstrip(",") if head else None
    for m in re.finditer(r"^(\w+)\s+(\d+) tensors\s+([0-9.]+) M params: (.*?); median of (\d+)\s*$", log, re.M):
        parts = re.split(r"[;,] ", m.group(4))
        base = re.match(r"(.+?)\s+([0-9.]+) ms$", parts[0].strip())
        if not base:
            continue
        o = {"tensors": int(m.group(2)), "params_m": float(m.group(3)), "baseline": base.group(1),
             "baseline_ms": float(base.group(2)), "repeats": int(m.group(5)), "kernels": {}}
        for part in parts[1:]:
            k = re.match(r"(?:batchdist )?(.+?)\s+([0-9.]+) ms \(([0-9.]+)x\)$", part.strip())
            if k:
                o["kernels"][k.group(1).replace("-", "_")] = {"ms": float(k.group(2)), "vs_baseline": float(k.group(3))}
        entry[m.group(1)] = o
    if ok and not ("adamw" in entry and "sgd" in entry):
        entry.update(ok=False, problem="no adamw and sgd lines from batchdist_optimizer_step in the log")

def oom(entry, d, ok):
    req = load(os.path.join(d, "request.json")) or {}
    r = load(os.path.join(d, "report.json")) or {}
    backs = r.get("oom_backoffs") or []
    lines = re.findall(r"oom back-off: .*", read(entry["log"]))
    entry.update({
        "precision": req.get("precision"), "asked_per_gpu_batch": req.get("per_gpu_batch"),
        "why_this_batch": req.get("why"),
        "backoffs": [{k: b.get(k) for k in ("step", "ranks", "from", "to", "peak_mb", "capacity_mb")} for b in backs],
        "backoff_line": lines[0] if lines else None,
        "per_gpu_batch_end": r.get("per_gpu_batch"), "accum_steps_end": r.get("accum_steps"),
        "finished": r.get("completed"), "stopped_by": r.get("stopped_by"), "steps": r.get("steps"),
        "images_per_s": r.get("samples_per_s"),
        "peak_memory_mb": (r.get("memory") or {}).get("peak_mb"),
        "gpu_memory_mb": (r.get("memory") or {}).get("total_mb"),
    })
    if r.get("error"):
        entry["error"] = r["error"]
    if ok and not backs:
        entry.update(ok=False, problem=f"per-GPU batch {req.get('per_gpu_batch')} did not run out of memory: "
                                       "no back-off to see (a larger --oom-batch)")
    elif ok and not r.get("completed"):
        entry.update(ok=False, problem="the run did not finish after backing off")
    elif not ok and r.get("stopped_by") == "out of memory":
        entry["problem"] = "out of memory with no smaller split left (report.json error)"

def resume(entry, d, ok):
    full = load(os.path.join(d, "full", "report.json")) or {}
    res = load(os.path.join(d, "cut", "report.json")) or {}
    m = re.search(r"model_diff: (\d+) tensors, (\d+) not bitwise equal, max \|a-b\| = ([^,\s]+)",
                  read(os.path.join(d, "diff.txt")))
    fails = re.findall(r"FAIL: (.*)", read(entry["log"]))
    k = re.search(r"killed after the checkpoint at step (\d+)", read(entry["log"]))
    entry.update({
        "device": full.get("device"), "backend": full.get("backend"),
        "checkpoint_step": int(k.group(1)) if k else None,
        "killed": "after_rename: killing" in read(os.path.join(d, "cut.log")),
        "resumed_from_step": (res.get("resumed_from") or {}).get("step"),
        "steps_uninterrupted": full.get("steps"), "steps_resumed": res.get("steps"),
        "tensors_compared": int(m.group(1)) if m else None,
        "tensors_not_bitwise_equal": int(m.group(2)) if m else None,
        "max_abs_diff": float(m.group(3)) if m else None,
        "bitwise_equal": (int(m.group(2)) == 0) if m else None,
    })
    if fails:
        entry["problem"] = fails[-1]

def photos(entry, d, ok):
    p = load(os.path.join(d, "folder", "photos.json")) or {}
    entry.update({k: p.get(k) for k in ("source", "generator", "why_not_photos", "files", "classes",
                                        "mean_mpx", "longer_side_px", "list_entries")})
    if ok and not p:
        entry.update(ok=False, problem="no photos.json")

def pipeline(entry, d, ok):
    r = load(os.path.join(d, "report.json")) or {}
    dp = r.get("data_pipeline") or {}
    entry.update({
        "photos": (load(os.path.join(os.path.dirname(d), "photos", "folder", "photos.json")) or {}).get("source"),
        "precision": r.get("precision"), "device": r.get("device"), "per_gpu_batch": r.get("per_gpu_batch"),
        "images_per_s": r.get("samples_per_s"),
        "data_wait_fraction": (r.get("time_breakdown") or {}).get("data_wait_fraction"),
        "loader_threads": dp.get("workers"), "loader_images_per_s": dp.get("loader_samples_per_s"),
        "data_errors": (r.get("data_errors") or {}).get("count"),
        "gpu_utilization": (r.get("memory") or {}).get("gpu_utilization"),
    })
    if ok and not dp:
        entry.update(ok=False, problem="no data_pipeline in report.json")

def data_verb(entry, d, ok):
    log, j = read(entry["log"]), None
    m = re.search(r"^\{\n.*?^\}$", log, re.S | re.M)
    if m:
        try:
            j = json.loads(m.group(0))
        except ValueError:
            j = None
    j = j or {}
    rank = (j.get("per_rank") or [{}])[0]
    entry.update({"images_per_s": j.get("samples_per_s"), "threads": j.get("workers"),
                  "measured_s": rank.get("seconds"), "images": rank.get("samples"),
                  "per_gpu_batch": rank.get("per_gpu"), "bytes_per_s": j.get("bytes_per_s"),
                  "data_errors": j.get("data_errors")})
    if ok and j.get("samples_per_s") is None:
        entry.update(ok=False, problem="no JSON with samples_per_s in the log")

def gloo2(entry, d, ok):
    r = load(os.path.join(d, "report.json")) or {}
    entry.update({k: r.get(k) for k in ("backend", "device", "world_size", "eval_accuracy", "samples_per_s")})
    refused = re.search(r"(host \S+ runs 2 ranks but this rank sees only.*)", read(entry["log"]))
    if refused:
        entry.update(ok=False, refused=True,
                     problem="batchdist refused 2 ranks on one GPU (worker/device.cc chooseDevice: more "
                             "ranks on a host than GPUs, also under gloo): " + refused.group(1)[:300])
    elif ok and not (r.get("backend") == "gloo" and r.get("world_size") == 2
                     and str(r.get("device", "")).startswith("cuda") and (r.get("eval_accuracy") or 0) >= 0.9):
        entry.update(ok=False, problem="expected backend gloo, world_size 2, a cuda device and eval_accuracy >= 0.9")

def unit_tests(entry, d, ok):
    log = read(entry["log"])
    found = re.findall(r"^\s*\d+/(\d+) Test\s+#\d+: (\S+) [. ]*(?:\*\*\*)?(.*?)\s+[0-9.]+ sec\s*$", log, re.M)
    rows = [(n, st) for _, n, st in found]
    passed = [n for n, st in rows if st == "Passed"]
    skipped = [n for n, st in rows if st.startswith(("Skipped", "Not Run"))]
    failed = [f"{n} ({st})" for n, st in rows if st != "Passed" and not st.startswith(("Skipped", "Not Run"))]
    # A crash: ctest's "Exception: SegFault", "Exception: Child aborted", ... (a signal, not an assertion).
    crashed = [f"{n} ({st})" for n, st in rows if st.startswith("Exception")]
    total = re.search(r"tests failed out of (\d+)", log)
    total = int(total.group(1)) if total else (int(found[0][0]) if found else None)
    done = {n for n, _ in rows}
    unfinished = [n for n in re.findall(r"^\s*Start\s+\d+: (\S+)\s*$", log, re.M) if n not in done]
    secs = re.search(r"Total Test time \(real\) =\s*([0-9.]+) sec", log)
    entry.update({"tests_total": total,
                  "tests_run": len(rows), "tests_passed": len(passed), "tests_failed": len(failed),
                  "tests_crashed": len(crashed), "tests_skipped": len(skipped),
                  "tests_unfinished": total - len(rows) if total is not None else None,
                  "failed_tests": failed[:40], "crashed_tests": crashed[:40], "unfinished_started": unfinished[:20],
                  "ctest_seconds": float(secs.group(1)) if secs else None})
    if entry["exit_code"] == 124:
        entry["problem"] = ("stopped at its cap (150 s) or the budget's deadline; the counts are of "
                            "the tests that finished")
    if "No tests were found" in log:
        entry.update(ok=False, problem="ctest found no tests labelled cuda_leg in the build directory")
    elif ok and not rows:
        entry.update(ok=False, problem="no test results in the ctest log")

parsers = {"quickstart": quickstart, "adaptive": adaptive, "oom": oom, "resume": resume, "photos": photos,
           "pipeline": pipeline, "data-verb": data_verb, "gloo2": gloo2, "unit-tests": unit_tests,
           "levers": levers, "trace": trace, "optimizer-step": optimizer_step}
def parser_of(name):
    if name in parsers:
        return parsers[name]
    for prefix, parse in (("resnet50-", resnet50), ("gpt2-", gpt2), ("ddp-", ddp)):
        if name.startswith(prefix):
            return parse
    return None

steps = list(csv.DictReader(open(os.path.join(out, "steps.tsv")), delimiter="\t"))
runs = {}
for s in steps:
    run = runs.setdefault(int(s["world"]), {"world_size": int(s["world"])})
    d, name, ok = s["dir"], s["step"], s["code"] == "0"
    if s["code"] == "skipped":
        skip = load(os.path.join(d, "skipped.json")) or {}
        run[name] = {"ok": True, "skipped": True, "why": skip.get("why", BUDGET)}
        run[name].update({k: skip[k] for k in ("left_s", "estimate_s") if k in skip})
        continue
    entry = {"ok": ok, "exit_code": int(s["code"]), "seconds": int(s["seconds"]), "log": os.path.join(d, "log")}
    if s["code"] == "124":
        entry["problem"] = "stopped at the time budget's deadline (--budget-s)"
    parse = parser_of(name)
    if parse:
        try:
            parse(entry, d, ok)
        except Exception as e:  # a summary of what is there, whatever is missing
            entry.update(ok=False, problem=f"summary: could not read the step's outputs: {e!r}")
    run[name] = entry
# Each pair: resnet50-X with ddp-X (images/s), gpt2-X with ddp-gpt2-X (tokens/s). DDP's
# MFU by batchdist's FLOPs per sample and peak where report.json has them (one count
# for both sides), else ddp_baseline.py's own.
for run in runs.values():
    for key in [k for k in run if k.startswith(("resnet50-", "gpt2-")) and not run[k].get("skipped")]:
        resnet = key.startswith("resnet50-")
        e, dd = run[key], run.get("ddp-" + (key.split("-", 1)[1] if resnet else key), {})
        rate = "images_per_s" if resnet else "tokens_per_s"
        a, b = e.get(rate), dd.get(rate)
        e["ddp_" + rate] = b
        e["vs_ddp"] = round(a / b, 3) if a and b else None
        fps, peak, sps = e.get("flops_per_sample"), e.get("peak_tflops"), dd.get("samples_per_s")
        if fps and peak and sps:
            e["ddp_mfu"] = round(sps * fps / (peak * 1e12 * run["world_size"]), 4)
            e["ddp_mfu_from"] = "batchdist's flops_per_sample and peak_tflops"
        else:
            e["ddp_mfu"] = dd.get("mfu")
            e["ddp_mfu_from"] = "bench/ddp_baseline.py" if dd.get("mfu") is not None else None
failed = [f"world {w} {k}" for w, run in runs.items() for k, v in run.items() if isinstance(v, dict) and not v["ok"]]
skipped = [f"world {w} {k}" for w, run in runs.items() for k, v in run.items() if isinstance(v, dict) and v.get("skipped")]
summary = {"host": host, "gpus": gpus, "gpu": gpu, "batchdist": version,
           "ok": not failed, "failed_steps": failed, "skipped_steps": skipped,
           "runs": [runs[w] for w in sorted(runs)]}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)

def num(v, fmt="%.0f"):
    return "?" if v is None else fmt % v
def pct(v):
    return "?" if v is None else "%.1f %%" % (100 * v)
def line(w, k, v):
    head = f"world {w} {k}{'' if v['ok'] else ' (FAILED)'}: "
    g = v.get
    if k.startswith("resnet50-") and v["ok"]:
        return (f"world {w} {k}: batch {g('chosen_per_gpu_batch')}/GPU, "
                f"{g('images_per_s') or 0:.0f} img/s ({g('vs_ddp')} x DDP), peak {g('peak_memory_mb') or 0:.0f} of "
                f"{g('memory_budget_mb') or 0:.0f} MB budget, OOM at {g('oom_boundary_batch')}, "
                f"data wait {100 * (g('data_wait_fraction') or 0):.1f} %; memory format {g('memory_format') or '?'}, "
                f"MFU {pct(g('mfu'))} (DDP {pct(g('ddp_mfu'))})"
                + (f", loss scale {num(g('loss_scale'))}, {g('skipped_steps')} skipped step(s)"
                   if "loss_scale" in v else ""))
    if k.startswith("gpt2-"):
        return (head + f"{g('per_gpu_batch')}/GPU x {num(g('tokens_per_sample'))} tokens, "
                f"{num(g('tokens_per_s'))} tokens/s ({g('vs_ddp')} x DDP's {num(g('ddp_tokens_per_s'))}), "
                f"MFU {pct(g('mfu'))} (DDP {pct(g('ddp_mfu'))}), peak {num(g('peak_memory_mb'))} MB")
    if k == "levers":
        outs = "; ".join(f"{o['levers']}: largest predicted {o['predicted_max_per_gpu']}, measured "
                         f"{o['measured_max_per_gpu']}" for o in g("outcomes") or [])
        return (head + f"chose per-GPU {g('chosen_per_gpu_batch')} x {g('chosen_accum')} ({g('chosen_levers')}) "
                f"within {num(g('memory_budget_mb'))} MB (search.memory_fraction {g('memory_fraction')}); "
                f"{outs or 'no lever outcomes'}; recompute weighed: {'yes' if g('recompute_weighed') else 'no'}")
    if k == "trace":
        n = g("nvml") or {}
        return (head + f"{num(g('kernels'))} GPU kernel events in steps {g('steps')}, "
                f"{num(g('nccl_kernels'))} NCCL kernel(s)" + (f" ({g('nccl_note')})" if g("nccl_note") else "")
                + f"; NVML at most: GPU {num(n.get('gpu_util_pct'))} %, {num(n.get('gpu_memory_used_mb'))} MB, "
                f"{num(n.get('gpu_power_w'))} W" + (f"; {g('problem')}" if g("problem") else ""))
    if k == "optimizer-step":
        parts = [f"{o} ({e['tensors']} tensors, {e['params_m']} M): "
                 + ", ".join(f"{kn.replace('_', '-')} {kv['vs_baseline']}x" for kn, kv in e["kernels"].items())
                 + f" {e['baseline']} ({e['baseline_ms']} ms)"
                 for o, e in v.items() if isinstance(e, dict) and "kernels" in e]
        return head + ("; ".join(parts) or "no figures")
    if k == "adaptive" and v["ok"]:
        return (f"world {w} adaptive: global batch {g('global_batch_start')} -> "
                f"{g('global_batch_end')} ({len(g('decisions') or [])} change(s)), accuracy "
                f"{100 * (g('eval_accuracy') or 0):.2f} %, {g('samples_per_s') or 0:.0f} samples/s")
    if k == "oom":
        b = g("backoffs") or []
        return (head + f"per-GPU batch {g('asked_per_gpu_batch')} ({g('precision')}): "
                + (f"{len(b)} back-off(s), {b[0].get('from')} -> {b[-1].get('to')} from step {b[0].get('step')}"
                   if b else "no back-off")
                + f"; finished: {'yes' if g('finished') else 'no'}, {num(g('images_per_s'))} img/s after it")
    if k == "resume":
        return (head + f"checkpoint at step {g('checkpoint_step')}, killed, resumed from step "
                f"{g('resumed_from_step')}: {g('tensors_compared')} tensors compared, "
                f"{g('tensors_not_bitwise_equal')} not bitwise equal (max |a-b| {g('max_abs_diff')})")
    if k == "photos":
        return (head + f"{g('files')} {g('source')} ({g('mean_mpx')} Mpx on average)"
                + (f"; no photos: {g('why_not_photos')}" if g("why_not_photos") else ""))
    if k == "pipeline":
        dw = g("data_wait_fraction")
        return (head + f"{num(g('images_per_s'))} img/s from {g('photos')} ({g('precision')}, per-GPU batch "
                f"{g('per_gpu_batch')}, {g('loader_threads')} loader threads), data wait "
                f"{num(None if dw is None else 100 * dw, '%.1f')} %")
    if k == "data-verb":
        return head + f"{num(g('images_per_s'))} img/s from the loader alone on {g('threads')} threads"
    if k == "gloo2":
        acc = g("eval_accuracy")
        return head + (g("problem") if g("refused") else
                       f"2 ranks on {g('device')} over {g('backend')}, accuracy "
                       f"{num(None if acc is None else 100 * acc, '%.2f')} %, {num(g('samples_per_s'))} samples/s")
    if k == "unit-tests":
        failed_tests = g("failed_tests") or []
        return (head + f"{g('tests_passed')} of {g('tests_total') or g('tests_run')} passed, "
                f"{g('tests_failed')} failed, {g('tests_crashed')} crashed, {g('tests_skipped')} skipped"
                + (f", {g('tests_unfinished')} unfinished" if g("tests_unfinished") else "")
                + (f" ({', '.join(failed_tests[:8])})" if failed_tests else ""))
    return None
for run in summary["runs"]:
    for k, v in run.items():
        if not isinstance(v, dict) or v.get("skipped"):
            continue
        try:
            text_line = line(run["world_size"], k, v)
        except (KeyError, TypeError, IndexError, ValueError) as e:
            text_line = f"world {run['world_size']} {k}: (see summary.json: {e!r})"
        if text_line:
            print(text_line)
verdict = "PASSED" if not failed else "FAILED: " + ", ".join(failed)
if skipped:
    verdict += f" ({len(skipped)} step(s) skipped, for the time budget or a step they need: {', '.join(skipped)})"
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

# --- the plan: the steps of each world size, the most valuable first --------------
# The order is the value of what a step tells (issue 61): that NCCL runs, resume is
# bitwise, the CUDA unit tests pass without a crash; ResNet-50 against DDP in both
# memory formats, GPT-2 small against DDP, the lever search, the trace and NVML,
# fp16 and its scaler, the optimizer step; then what the first GPU run measured
# already (oom, fp32, the photo pipeline, Gloo on one GPU) and the adaptive batch.
# trace only reads resnet50-P0's outputs, so it comes right after them.
plan_groups() {  # W -> the plan's groups (a pair, the photo steps), one a line
  local w=$1 p
  echo quickstart
  [ "$w" = 1 ] && echo resume && echo unit-tests
  echo "resnet50-$primary ddp-$primary"
  echo trace
  echo "resnet50-$primary-cl ddp-$primary-cl"
  echo "gpt2-$primary ddp-gpt2-$primary"
  echo levers
  [ "$primary" != fp16 ] && [[ " $precisions " == *" fp16 "* ]] && echo "resnet50-fp16-cl ddp-fp16-cl"
  [ "$w" = 1 ] && echo optimizer-step && echo oom
  for p in $precisions; do
    [ "$p" = "$primary" ] || [ "$p" = fp16 ] || echo "resnet50-$p-cl ddp-$p-cl"
  done
  [ "$w" = 1 ] && echo "photos pipeline data-verb" && echo gloo2
  echo adaptive
}
plan_steps() {  # W -> step names, in the order they run
  plan_groups "$1" | tr '\n' ' '
}
plan_line() {  # W -> the plan as one line, pairs and groups together
  plan_groups "$1" | sed 's/^quickstart$/quickstart (nccl)/' | paste -sd ';' | sed 's/;/; /g'
}
data_seconds=10      # how long `batchdist data` is timed
unit_tests_cap=150   # seconds the unit-tests step may take at most
# Under --budget-s a step runs only when its estimate (a pair's first step: the
# pair's) fits in what is left; the first that does not is skipped with the rest of
# its world's plan, and a running step is stopped (exit 124) at the deadline; the
# summary is rewritten after every step. About 1.2-1.5x what one H200 took on
# 2026-11-30 (docs/gpu.md, "The first GPU run", at --steps 40 --samples 30000:
# quickstart 4 s, resnet50-bf16 48 (its search 30), ddp 34, oom 25, photos 11,
# pipeline 21, data-verb 12, gloo2 3, unit-tests 151 at its cap), so that the
# budget cuts the tail, not the head. Not measured yet, so guessed from the
# H200's: resume (three quickstart runs of 200 steps), trace (reads a file), gpt2
# and its DDP (startup ~10 s as ResNet-50's, then at ~300k tokens/s a step of 16
# windows of 1024 takes ~0.05 s), levers (a search of ~10 measurements of a
# second, as resnet50's took 30 s for 9), optimizer-step (one translation unit
# with torch/torch.h built, then ~5 s), adaptive. steps.tsv has each step's time.
estimate() {
  case $1 in
    quickstart) echo 10 ;;
    resume) echo 20 ;;
    unit-tests) echo "$unit_tests_cap" ;;   # ctest -j (cores), stopped at the cap
    resnet50-*) echo $(( 35 + steps / 2 + samples / 10000 )) ;;  # the search: ~30 s
    ddp-gpt2-*) echo $(( 20 + steps * gpt_batch / 64 )) ;;
    ddp-*) echo $(( 20 + steps / 2 )) ;;
    trace) echo 10 ;;
    gpt2-*) echo $(( 25 + steps * gpt_batch / 64 )) ;;
    levers) echo 50 ;;
    optimizer-step) echo 50 ;;
    oom) echo 35 ;;            # a failed step at 2x the batch, then 10 steps at half of it
    photos) echo $(( 10 + photos / 100 )) ;;
    pipeline) echo $(( 20 + steps / 4 )) ;;
    data-verb) echo $(( 10 + data_seconds )) ;;
    gloo2) echo 10 ;;
    adaptive) echo 90 ;;
    *) echo 60 ;;
  esac
}
need_of() {  # STEP -> the seconds it must have left: a pair's first step needs both
  local s=$1
  case $s in
    resnet50-*) echo $(( $(estimate "$s") + $(estimate "ddp-${s#resnet50-}") )) ;;
    gpt2-*) echo $(( $(estimate "$s") + $(estimate "ddp-$s") )) ;;
    *) estimate "$s" ;;
  esac
}

echo "gpu_acceptance: $gpus GPU(s) on $(hostname); world sizes: $worlds; precisions: $precisions"
echo "  build: $build ($([ $skip_build = 1 ] && echo "existing" || echo "tests/cuda_leg.sh$([ $leg_tests = 1 ] || echo " --no-tests")"))"
echo "  output: $out"
[ -n "$budget" ] && echo "  budget: $budget s (the first step that would not fit is skipped, and the rest of its world's plan)"
clock=0   # the budget's projection: the estimates of the steps that fit, in order
for w in $worlds; do
  echo "  world $w: $(plan_line "$w")"
  total=0 line="" ran=0 cut=0 tail=""
  for s in $(plan_steps "$w"); do
    total=$(( total + $(estimate "$s") ))
    line+="$s $(estimate "$s"), "
    if [ -n "$budget" ]; then
      if [ "$cut" = 0 ] && [ $(( budget - clock )) -ge "$(need_of "$s")" ]; then
        clock=$(( clock + $(estimate "$s") )) ran=$(( ran + 1 ))
      else
        cut=1 tail+=" $s"
      fi
    fi
  done
  echo "    estimates (s): ${line%, }; in all $total"
  [ -n "$budget" ] && echo "    within $budget s by the estimates$([ "$skip_build" = 1 ] || echo " (the build not counted)"): $ran step(s) run, to $clock s; the tail skipped:${tail:- none}"
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
skip_step() {  # W NAME WHY [LEFT ESTIMATE MESSAGE]: recorded as skipped, with why
  local dir="$out/w$1/$2"
  mkdir -p "$dir"
  "$py" -c 'import json, sys
j = {"why": sys.argv[2]}
if len(sys.argv) > 3:
    j.update(left_s=int(sys.argv[3]), estimate_s=int(sys.argv[4]))
json.dump(j, open(sys.argv[1], "w"))' "$dir/skipped.json" "$3" "${@:4:2}" || true
  printf '%s\t%s\tskipped\t0\t%s\n' "$1" "$2" "$dir" >>"$out/steps.tsv"
  echo "== world $1, $2: skipped (${6:-$3})"
  summarize "$out" >/dev/null 2>&1 || true
}
cut_world="" cut_step=""   # the world whose plan the budget cut, at which step
step() {
  local w=$1 name=$2 dir="$out/w$1/$2"; shift 2
  local t0 code=0 limit=()
  if [ -n "$deadline" ]; then
    local left need
    left=$(( deadline - $(date +%s) ))
    need=$(need_of "$name")
    if [ "$cut_world" = "$w" ]; then  # the tail after a step that did not fit
      skip_step "$w" "$name" "did not fit in the time budget (--budget-s)" "$left" "$need" \
        "the tail after $cut_step, which did not fit; ${left} s left"
      return 0
    fi
    if [ "$left" -lt "$need" ]; then
      cut_world=$w cut_step=$name
      skip_step "$w" "$name" "did not fit in the time budget (--budget-s)" "$left" "$need" \
        "${left} s left of the budget, it needs about $need s; the rest of world $w's plan is skipped too"
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
status_of() {  # W NAME -> the step's exit code, "skipped", or nothing when it has not run
  awk -F'\t' -v w="$1" -v s="$2" '$1 == w && $2 == s { c = $3 } END { print c }' "$out/steps.tsv"
}
# Fields of a JSON file, for the commands that need them (the chosen batch).
json_get() { "$py" -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v[int(k)] if isinstance(v, list) else v[k]
print(v)' "$1" "$2"; }

# The oom step's per-GPU batch (writes DIR/request.json, prints the batch): --oom-batch;
# else twice the largest batch that fit in the search at that precision (it ran out of
# memory there, or was over the 90 % budget: twice that does not fit), and at least the
# smallest that ran out of memory; without a search, 1.5 x what the GPU's memory holds
# by a rule of thumb for ResNet-50 at 224 px (100 MB an image in fp32, 50 in bf16/fp16).
oom_request() {
  mkdir -p "$1"
  "$py" - "$1/request.json" "$out/w1/resnet50-$primary/search.json" "$out/gpu.txt" "$primary" \
    "$oom_batch" <<'PY'
import json, math, re, sys
dest, search, gpu, prec, forced = sys.argv[1:6]
def batch():
    if forced:
        return int(forced), "--oom-batch"
    try:
        cands = json.load(open(search)).get("candidates", [])
    except (OSError, ValueError):
        cands = []
    fits = [c["per_gpu_batch"] for c in cands if not c["failed"]]
    ooms = [c["per_gpu_batch"] for c in cands if c["failed"] and c["reason"].startswith("out of memory")]
    if fits:
        n = max(2 * max(fits), min(ooms) if ooms else 0)
        return n, (f"twice the largest per-GPU batch that fit in resnet50-{prec}'s search ({max(fits)}"
                   + (f"; the smallest that ran out of memory there: {min(ooms)})" if ooms else ")"))
    try:
        mb = float(re.findall(r"([0-9.]+) *MiB", open(gpu).read())[0])
    except (OSError, IndexError):
        mb = 81559.0
    per = 100 if prec == "fp32" else 50
    n = int(math.ceil(1.5 * mb / per / 64) * 64)
    return n, f"no search: 1.5 x {mb:.0f} MiB / {per} MB an image ({prec}), rounded up to 64"
n, why = batch()
json.dump({"per_gpu_batch": n, "precision": prec, "why": why}, open(dest, "w"), indent=2)
print(n)
PY
}

# Token windows for the GPT-2 steps (DIR/train.bin: 4096 windows of 1024 + 1, val.bin:
# 32): uniformly random GPT-2 ids (< 50257) as uint16, made once: a throughput
# measurement needs no text, and both sides read the same file.
gpt_tokens() {
  "$py" - "$1" <<'PY'
import array, os, random, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = random.Random(0)
for name, windows in (("train.bin", 4096), ("val.bin", 32)):
    path = os.path.join(d, name)
    if os.path.exists(path):
        continue
    raw = array.array("H")
    raw.frombytes(rng.randbytes(2 * (windows * 1024 + 1)))
    ids = array.array("H", (x % 50257 for x in raw))
    if sys.byteorder != "little":
        ids.byteswap()
    with open(path + ".part", "wb") as f:
        f.write(ids.tobytes())
    os.replace(path + ".part", path)
PY
}

# The levers step's search.memory_fraction (writes DIR/request.json, prints it):
# --lever-fraction; else 7/8 of the way from gpt2-P0's fixed memory (parameters,
# gradients, optimizer state: Note [memory by part]) to its peak at per-GPU
# --gpt-batch, over the GPU's memory: plain data parallel then fits only smaller
# batches (its activations grow with the batch), so memory bounds the walk and
# recompute is weighed (Note [lever search]); recompute fits --gpt-batch when it
# saves more than 1/8 of the activations. Without that run, 12000 MB, what GPT-2
# small needs at per-GPU 8 to 12 in bf16 by a rule of thumb.
lever_request() {
  mkdir -p "$1"
  "$py" - "$1/request.json" "$out/w$2/gpt2-$primary/report.json" "$out/gpu.txt" "$lever_fraction" <<'PY'
import json, re, sys
dest, report, gpu, forced = sys.argv[1:5]
def total_mb():
    try:
        return float(re.findall(r"([0-9.]+) *MiB", open(gpu).read())[0])
    except (OSError, IndexError):
        return 81559.0
def choose():
    if forced:
        return float(forced), None, None, "--lever-fraction"
    try:
        r = json.load(open(report))
    except (OSError, ValueError):
        r = {}
    m = r.get("memory") or {}
    peak, total, b = m.get("peak_mb"), m.get("total_mb"), r.get("per_gpu_batch")
    fixed = sum(m.get(k) or 0 for k in ("parameters_mb", "gradients_mb", "optimizer_state_mb"))
    if peak and total and b and peak > fixed:
        limit = fixed + (peak - fixed) * 7 / 8
        return limit / total, limit, total, (
            f"7/8 of the way from gpt2's fixed memory ({fixed:.0f} MB) to its peak at per-GPU {b} "
            f"({peak:.0f} MB): {limit:.0f} MB of {total:.0f}")
    total = total_mb()
    return 12000 / total, 12000.0, total, f"no gpt2 report: 12000 MB of {total:.0f} (a rule of thumb)"
f, limit, total, why = choose()
f = round(min(1.0, max(0.05, f)), 4)
json.dump({"memory_fraction": f, "limit_mb": limit, "gpu_memory_mb": total, "why": why}, open(dest, "w"), indent=2)
print(f)
PY
}

run_step() {  # W NAME: the step's command
  local w=$1 s=$2 p chosen n
  local mpi=(mpirun "${mpi_flags[@]}" -np "$w") gpu=(--set train.device=cuda --set dist.backend=nccl)
  case $s in
    quickstart)
      step "$w" quickstart "${mpi[@]}" "$bin" "$src/configs/quickstart.yaml" -q "${gpu[@]}" \
        --output "$out/w$w/quickstart" ;;
    resnet50-*)
      # resnet50-P: contiguous (NCHW); resnet50-P-cl: channels_last (train.memory_format).
      p=${s#resnet50-}
      local prec=${p%-cl} fmt=contiguous
      [ "$prec" = "$p" ] || fmt=channels_last
      # The primary precision's contiguous run also traces 3 steps after 10 (Note [step
      # profiler]): trace_phases.json, each phase's share (bench/trace_phases.py),
      # and the trace step's kernels and NCCL.
      local trace=()
      [ "$p" = "$primary" ] && trace=(--set profile.wait=10 --set profile.warmup=2 --set profile.active=3)
      step "$w" "$s" "${mpi[@]}" "$bin" "$src/configs/resnet50-synthetic.yaml" \
        --set batch.per_gpu=auto --set train.precision="$prec" --set train.memory_format="$fmt" \
        "${gpu[@]}" "${trace[@]}" \
        --set data.samples="$samples" --set train.max_steps="$steps" --output "$out/w$w/$s"
      if [ -d "$out/w$w/$s/profile" ]; then
        "$py" "$here/trace_phases.py" --json "$out/w$w/$s/profile" >"$out/w$w/$s/trace_phases.json" \
          2>"$out/w$w/$s/trace_phases.log" || true
      fi ;;
    ddp-gpt2-*)
      p=${s#ddp-gpt2-}
      if [ "$(status_of "$w" "gpt2-$p")" = skipped ]; then
        skip_step "$w" "$s" "gpt2-$p was skipped, and this is its comparison"
        return 0
      fi
      gpt_tokens "$out/tokens" >/dev/null 2>&1 || true
      # The shape and the optimizer of configs/gpt2-small.yaml (Note [gpt]); SDPA, no compile.
      step "$w" "$s" "$venv/bin/torchrun" --standalone --nproc_per_node "$w" "$here/ddp_baseline.py" \
        --model gpt --device cuda --precision "$p" --per-gpu-batch "$gpt_batch" --tokens "$out/tokens/train.bin" \
        --layers 12 --heads 12 --embed 768 --vocab 50304 --seq-len 1024 --dropout 0 \
        --lr 0.0006 --beta1 0.9 --beta2 0.95 --weight-decay 0.1 --clip-grad-norm 1.0 \
        --steps "$steps" --warmup 5 ;;
    ddp-*)
      p=${s#ddp-}
      if [ "$(status_of "$w" "resnet50-$p")" = skipped ]; then
        skip_step "$w" "$s" "resnet50-$p was skipped, and its search picks DDP's batch"
        return 0
      fi
      chosen=$(json_get "$out/w$w/resnet50-$p/search.json" chosen 2>/dev/null || true)
      [[ $chosen =~ ^[1-9][0-9]*$ ]] || chosen=64
      local cl=()
      [ "${p%-cl}" = "$p" ] || cl=(--channels-last)
      step "$w" "$s" "$venv/bin/torchrun" --standalone --nproc_per_node "$w" "$here/ddp_baseline.py" \
        --model resnet50 --device cuda --precision "${p%-cl}" --per-gpu-batch "$chosen" --classes 100 \
        "${cl[@]}" --steps "$steps" --warmup 5 ;;
    trace)
      # resnet50-P0's trace and metrics, read again: kernels, NCCL, NVML (bench/gpu_trace_check.py).
      if [ ! -d "$out/w$w/resnet50-$primary/profile" ]; then
        skip_step "$w" trace "resnet50-$primary left no profiler trace"
        return 0
      fi
      step "$w" trace "$py" "$here/gpu_trace_check.py" "$out/w$w/resnet50-$primary" --world "$w" \
        --out "$out/w$w/trace/trace_check.json" ;;
    gpt2-*)
      p=${s#gpt2-}
      gpt_tokens "$out/tokens" >/dev/null 2>&1 || true
      # GPT-2 small as configured, at a fixed per-GPU batch (no accumulation, no search).
      step "$w" "$s" "${mpi[@]}" "$bin" "$src/configs/gpt2-small.yaml" -q "${gpu[@]}" \
        --set data.path="$out/tokens/train.bin" --set data.val_path="$out/tokens/val.bin" \
        --set batch.global_tokens=0 --set batch.global=$(( gpt_batch * w )) --set batch.per_gpu="$gpt_batch" \
        --set train.precision="$p" --set train.max_steps="$steps" --set train.epochs=1000 \
        --set checkpoint.every_minutes=0 --set checkpoint.resume=off --output "$out/w$w/$s" ;;
    levers)
      # Note [lever search] on the GPU: dist.shard (W > 1) and model.recompute weighed
      # with the per-GPU batch at a global batch of 4 x --gpt-batch per GPU, under a
      # memory fraction that bounds plain data parallel (lever_request).
      gpt_tokens "$out/tokens" >/dev/null 2>&1 || true
      local fraction
      fraction=$(lever_request "$out/w$w/levers" "$w") || fraction=0.1
      step "$w" levers "${mpi[@]}" "$bin" search "$src/configs/gpt2-small.yaml" -q "${gpu[@]}" \
        --set data.path="$out/tokens/train.bin" --set data.val_path="$out/tokens/val.bin" \
        --set batch.global_tokens=0 --set batch.global=$(( 4 * gpt_batch * w )) --set batch.per_gpu=auto \
        --set dist.shard=auto --set model.recompute=auto --set search.memory_fraction="$fraction" \
        --set train.precision="$primary" --output "$out/w$w/levers" ;;
    optimizer-step)
      # Note [multi-tensor step]: bench/optimizer_step.cc, not built by default.
      local cmake
      cmake=$(sed -n 's/^CMAKE_COMMAND:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
      [ -x "${cmake:-}" ] || cmake=$(command -v cmake || echo cmake)
      # shellcheck disable=SC2016  # $1-$3 are the inner shell's
      step "$w" optimizer-step bash -c '"$1" --build "$2" --target batchdist_optimizer_step -j "$3" &&
        "$2/bench/batchdist_optimizer_step" 1 15 cuda' _ "$cmake" "$build" "$(nproc)" ;;
    oom)
      # A real out-of-memory (no fault injection): Note [oom back-off], docs/out-of-memory.md.
      n=$(oom_request "$out/w$w/oom") || n=2048
      step "$w" oom "${mpi[@]}" "$bin" "$src/configs/resnet50-synthetic.yaml" -q \
        --set batch.per_gpu="$n" --set train.precision="$primary" "${gpu[@]}" \
        --set data.samples="$(( samples > 12 * n ? samples : 12 * n ))" --set train.max_steps=10 \
        --output "$out/w$w/oom" ;;
    resume)
      step "$w" resume "$here/gpu_resume_check.sh" "$out/w$w/resume" "$bin" \
        "$build/tests/batchdist_model_diff" "$src/configs/quickstart.yaml" 200 100 "${gpu[@]}" ;;
    photos)
      step "$w" photos "$py" "$here/gpu_photos.py" "$out/w$w/photos/folder" --count "$photos" \
        --repeat $(( (8192 + photos - 1) / photos )) --make-data "$build/tests/batchdist_make_data" \
        --source "$photos_from" ;;
    pipeline|data-verb)
      if [ "$(status_of "$w" photos)" != 0 ]; then
        skip_step "$w" "$s" "the photos step made no image folder"
        return 0
      fi
      chosen=$(json_get "$out/w$w/resnet50-bf16/search.json" chosen 2>/dev/null || true)
      [[ $chosen =~ ^[1-9][0-9]*$ ]] || chosen=256
      local folder="$out/w$w/photos/folder"
      local data=(--set data.path="$folder" --set data.list="$folder/list.txt" --set data.val_fraction=0
                  --set batch.per_gpu="$chosen" --set batch.global="$chosen")
      if [ "$s" = pipeline ]; then
        step "$w" pipeline "${mpi[@]}" "$bin" "$src/configs/resnet50-imagenet.yaml" -q "${data[@]}" \
          --set data.workers=auto --set train.precision=bf16 "${gpu[@]}" --set train.max_steps="$steps" \
          --set checkpoint.resume=off --set checkpoint.every_minutes=0 --output "$out/w$w/pipeline"
      else
        n=$(( $(nproc) - 1 ))
        [ "$n" -ge 1 ] || n=1
        step "$w" data-verb "${mpi[@]}" "$bin" data "$src/configs/resnet50-imagenet.yaml" -q "${data[@]}" \
          --set data.workers="$n" --seconds "$data_seconds" --json --output "$out/w$w/data-verb"
      fi ;;
    gloo2)
      # Both ranks on the first visible GPU (a node with more would give each its own).
      local first=${CUDA_VISIBLE_DEVICES:-0}
      step "$w" gloo2 mpirun "${mpi_flags[@]}" -np 2 -x CUDA_VISIBLE_DEVICES="${first%%,*}" "$bin" \
        "$src/configs/quickstart.yaml" -q --set train.device=cuda --set dist.backend=gloo \
        --output "$out/w$w/gloo2" ;;
    unit-tests)
      local ctest
      ctest=$(sed -n 's/^CMAKE_CTEST_COMMAND:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
      [ -x "${ctest:-}" ] || ctest=$(command -v ctest || echo "$venv/bin/ctest")
      # Capped: most tests carry a TIMEOUT of 300-600 s of their own, which ctest's
      # --timeout does not shorten; a cut run's summary counts the tests that finished.
      step "$w" unit-tests timeout --kill-after=10 "$unit_tests_cap" env -C "$build" "$ctest" \
        -L cuda_leg -j "$(nproc)" --output-on-failure ;;
    adaptive)
      # Note [goodput]: one rank measures the noise scale only across micro-batches.
      local split=(--set batch.per_gpu=auto)
      [ "$w" = 1 ] && split=(--set batch.per_gpu=16)
      step "$w" adaptive "${mpi[@]}" "$bin" "$src/configs/adaptive-wide.yaml" -q \
        --set batch.adapt=goodput "${split[@]}" "${gpu[@]}" --output "$out/w$w/adaptive" ;;
    *) echo "gpu_acceptance.sh: no step $s" >&2; exit 1 ;;
  esac
}

for w in $worlds; do
  for s in $(plan_steps "$w"); do run_step "$w" "$s"; done
done

summarize "$out"

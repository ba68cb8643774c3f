#!/usr/bin/env bash
# GPU acceptance: the one script to run on a node with NVIDIA GPUs to see that
# batchdist works there and how fast. It builds the CUDA leg (tests/cuda_leg.sh:
# LibTorch 2.x wheel, CUDA, NCCL), then runs these steps, the most valuable first
# (P0 is bf16, or the first of --precisions without it), on 1 GPU and, with more
# GPUs, again on all of them (the steps marked * on 1 GPU only):
#   quickstart     configs/quickstart.yaml over NCCL (accuracy >= 0.9)
#   resnet50-P0    configs/resnet50-synthetic.yaml with batch.per_gpu: auto: the
#                  search table, the chosen batch, peak memory against the
#                  search.memory_fraction budget (90 % of the GPU), the out-of-memory
#                  boundary, images/s and the data-stall fraction
#                  (report.json time_breakdown.data_wait_fraction); its system
#                  metrics (NVML, CPU) and diagnosis, and a profiler trace of steps
#                  13-15 with each phase's share of them and the GPU's busy share
#                  (bench/trace_phases.py: trace_phases.json)
#   ddp-P0         PyTorch DDP (torchrun from the same venv, same model, per-GPU batch
#                  and precision; bench/ddp_baseline.py), and the ratio batchdist
#                  images/s / DDP images/s
#   oom*           a real CUDA out-of-memory in training: ResNet-50 at P0 with a fixed
#                  per-GPU batch twice the largest that fit in resnet50-P0's search
#                  (--oom-batch N); the back-off (batch and accumulation before and
#                  after), whether the run finished, images/s after it
#   resume*        checkpoint at step 100, SIGKILL, --resume auto, on the GPU (quickstart
#                  with dropout: the CUDA RNG): model.pt compared with the uninterrupted
#                  run's, tensor by tensor, bitwise (bench/gpu_resume_check.sh)
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
#   unit-tests*    the CUDA build's `ctest -L cuda_leg` with the GPU visible: counts
#                  of passed, failed and skipped tests, the failed ones named
#   resnet50-P, ddp-P   for the other precisions of --precisions (fp32 fp16)
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
#                           [--photos-from auto|photos|patterns]
#                           [--build-dir DIR] [--skip-build] [--leg-tests] [--venv DIR]
#                           [--budget-s S] [--dry-run]
#   bench/gpu_acceptance.sh --summarize OUT
#     --gpus N      use N GPUs for the "all GPUs" runs (default: every visible one)
#     --samples N   synthetic images, so the search can reach out-of-memory [50000]
#     --steps N     training steps per run, and timed DDP steps [60]
#     --photos N    photos the pipeline step decodes [1024]
#     --photos-from S  photos: real photos or the photos step fails; patterns: class
#                   patterns, whatever this machine has; auto: photos where the
#                   venv's Python (or /usr/bin/python3) has PIL, numpy and
#                   scikit-image's photos, else patterns [auto]
#     --oom-batch N the per-GPU batch of the oom step [twice the largest that fit in
#                   the search; without a search, 1.5 x what the GPU's memory holds
#                   by a rule of thumb]
#     --skip-build  use the existing BUILD_DIR/launcher/batchdist and venv
#     --leg-tests   also run the CUDA leg's ctest selection when building (on the CPU)
#     --venv DIR    the Python environment with torch and torchrun (DDP, the summary)
#                   [the CUDA leg's venv: tests/cuda_leg.sh --venv]
#     --budget-s S  finish within S seconds: a step that would not fit in what is
#                   left (by its estimate; --dry-run prints them) is skipped and
#                   recorded as skipped, and a running step is stopped at the
#                   deadline [no limit]
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
photos=1024
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
    })
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
    m = re.findall(r"samples_per_s ([0-9.]+)", read(entry["log"]))
    entry["images_per_s"] = float(m[-1]) if m else None
    if ok and not m:
        entry.update(ok=False, problem="no samples_per_s in the DDP log")

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
    rows = re.findall(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) [. ]*(?:\*\*\*)?(.*?)\s+[0-9.]+ sec\s*$", log, re.M)
    passed = [n for n, st in rows if st == "Passed"]
    skipped = [n for n, st in rows if st.startswith(("Skipped", "Not Run"))]
    failed = [f"{n} ({st})" for n, st in rows if st != "Passed" and not st.startswith(("Skipped", "Not Run"))]
    total = re.search(r"tests failed out of (\d+)", log)
    secs = re.search(r"Total Test time \(real\) =\s*([0-9.]+) sec", log)
    entry.update({"tests_total": int(total.group(1)) if total else None,
                  "tests_run": len(rows), "tests_passed": len(passed), "tests_failed": len(failed),
                  "tests_skipped": len(skipped), "failed_tests": failed[:40],
                  "ctest_seconds": float(secs.group(1)) if secs else None})
    if entry["exit_code"] == 124:
        entry["problem"] = ("stopped at its cap (150 s) or the budget's deadline; the counts are of "
                            "the tests that finished")
    if "No tests were found" in log:
        entry.update(ok=False, problem="ctest found no tests labelled cuda_leg in the build directory")
    elif ok and not rows:
        entry.update(ok=False, problem="no test results in the ctest log")

parsers = {"quickstart": quickstart, "adaptive": adaptive, "oom": oom, "resume": resume, "photos": photos,
           "pipeline": pipeline, "data-verb": data_verb, "gloo2": gloo2, "unit-tests": unit_tests}

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
    parse = parsers.get(name) or (resnet50 if name.startswith("resnet50-") else ddp if name.startswith("ddp-") else None)
    if parse:
        try:
            parse(entry, d, ok)
        except Exception as e:  # a summary of what is there, whatever is missing
            entry.update(ok=False, problem=f"summary: could not read the step's outputs: {e!r}")
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

def num(v, fmt="%.0f"):
    return "?" if v is None else fmt % v
def line(w, k, v):
    head = f"world {w} {k}{'' if v['ok'] else ' (FAILED)'}: "
    g = v.get
    if k.startswith("resnet50-") and v["ok"]:
        return (f"world {w} {k}: batch {g('chosen_per_gpu_batch')}/GPU, "
                f"{g('images_per_s') or 0:.0f} img/s ({g('vs_ddp')} x DDP), peak {g('peak_memory_mb') or 0:.0f} of "
                f"{g('memory_budget_mb') or 0:.0f} MB budget, OOM at {g('oom_boundary_batch')}, "
                f"data wait {100 * (g('data_wait_fraction') or 0):.1f} %")
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
                f"{g('tests_failed')} failed, {g('tests_skipped')} skipped"
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
# (a budget cut takes the tail: the other precisions and the adaptive run)
plan_steps() {  # W -> step names, in the order they run
  local w=$1 p
  echo quickstart "resnet50-$primary" "ddp-$primary"
  [ "$w" = 1 ] && echo oom resume photos pipeline data-verb gloo2 unit-tests
  for p in $precisions; do [ "$p" = "$primary" ] || echo "resnet50-$p" "ddp-$p"; done
  echo adaptive
}
plan_line() {  # W -> the plan as one line, pairs and groups together
  local w=$1 p line
  line="quickstart (nccl); resnet50-$primary ddp-$primary; "
  [ "$w" = 1 ] && line+="oom; resume; photos pipeline data-verb; gloo2; unit-tests; "
  for p in $precisions; do [ "$p" = "$primary" ] || line+="resnet50-$p ddp-$p; "; done
  echo "${line}adaptive"
}
data_seconds=10      # how long `batchdist data` is timed
unit_tests_cap=150   # seconds the unit-tests step may take at most
# Under --budget-s a step runs only when its estimate fits in what is left, and is
# stopped (exit 124) at the deadline; the summary is rewritten after every step.
# About 1.5-2x what one H200 took on 2026-11-30 (docs/gpu.md, "The first GPU run":
# quickstart 4 s, resnet50-bf16 48 s at 40 steps and 30000 images, ddp 34, oom 25,
# photos 11, pipeline 21, data-verb 12, gloo2 3); resume and adaptive not yet
# measured (steps.tsv has each run's times).
estimate() {
  case $1 in
    quickstart) echo 15 ;;
    resnet50-*) echo $(( 30 + steps / 2 + samples / 2000 )) ;;  # searches dominate
    ddp-*) echo $(( 20 + steps / 2 )) ;;
    oom) echo 40 ;;            # a failed step at 2x the batch, then 10 steps at half of it
    resume) echo 40 ;;         # three quickstart runs of 200 steps, one killed
    photos) echo $(( 10 + photos / 100 )) ;;
    pipeline) echo $(( 20 + steps / 4 )) ;;
    data-verb) echo $(( 10 + data_seconds )) ;;
    gloo2) echo 15 ;;
    unit-tests) echo 120 ;;    # ctest -j (cores), stopped after $unit_tests_cap s
    adaptive) echo 90 ;;
    *) echo 60 ;;
  esac
}

echo "gpu_acceptance: $gpus GPU(s) on $(hostname); world sizes: $worlds; precisions: $precisions"
echo "  build: $build ($([ $skip_build = 1 ] && echo "existing" || echo "tests/cuda_leg.sh$([ $leg_tests = 1 ] || echo " --no-tests")"))"
echo "  output: $out"
[ -n "$budget" ] && echo "  budget: $budget s (a step that would not fit is skipped)"
for w in $worlds; do
  echo "  world $w: $(plan_line "$w")"
  total=0 line=""
  for s in $(plan_steps "$w"); do
    total=$(( total + $(estimate "$s") ))
    line+="$s $(estimate "$s"), "
  done
  echo "    estimates (s): ${line%, }; in all $total"
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
step() {
  local w=$1 name=$2 dir="$out/w$1/$2"; shift 2
  local t0 code=0 limit=()
  if [ -n "$deadline" ]; then
    local left need
    left=$(( deadline - $(date +%s) ))
    need=$(estimate "$name")
    if [ "$left" -lt "$need" ]; then
      skip_step "$w" "$name" "did not fit in the time budget (--budget-s)" "$left" "$need" \
        "${left} s left of the budget, it needs about $need s"
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

run_step() {  # W NAME: the step's command
  local w=$1 s=$2 p chosen n
  local mpi=(mpirun "${mpi_flags[@]}" -np "$w") gpu=(--set train.device=cuda --set dist.backend=nccl)
  case $s in
    quickstart)
      step "$w" quickstart "${mpi[@]}" "$bin" "$src/configs/quickstart.yaml" -q "${gpu[@]}" \
        --output "$out/w$w/quickstart" ;;
    resnet50-*)
      p=${s#resnet50-}
      # The primary precision's run also traces 3 steps after 10 (Note [step
      # profiler]): trace_phases.json, each phase's share (bench/trace_phases.py).
      local trace=()
      [ "$p" = "$primary" ] && trace=(--set profile.wait=10 --set profile.warmup=2 --set profile.active=3)
      step "$w" "$s" "${mpi[@]}" "$bin" "$src/configs/resnet50-synthetic.yaml" \
        --set batch.per_gpu=auto --set train.precision="$p" "${gpu[@]}" "${trace[@]}" \
        --set data.samples="$samples" --set train.max_steps="$steps" --output "$out/w$w/$s"
      if [ -d "$out/w$w/$s/profile" ]; then
        "$py" "$here/trace_phases.py" --json "$out/w$w/$s/profile" >"$out/w$w/$s/trace_phases.json" \
          2>"$out/w$w/$s/trace_phases.log" || true
      fi ;;
    ddp-*)
      p=${s#ddp-}
      if [ "$(status_of "$w" "resnet50-$p")" = skipped ]; then
        skip_step "$w" "$s" "resnet50-$p was skipped, and its search picks DDP's batch"
        return 0
      fi
      chosen=$(json_get "$out/w$w/resnet50-$p/search.json" chosen 2>/dev/null || true)
      [[ $chosen =~ ^[1-9][0-9]*$ ]] || chosen=64
      step "$w" "$s" "$venv/bin/torchrun" --standalone --nproc_per_node "$w" "$here/ddp_baseline.py" \
        --model resnet50 --device cuda --precision "$p" --per-gpu-batch "$chosen" --classes 100 \
        --steps "$steps" --warmup 5 ;;
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

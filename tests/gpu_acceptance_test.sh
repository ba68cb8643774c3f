#!/usr/bin/env bash
# The parts of bench/gpu_acceptance.sh that need no GPU: the script parses,
# (shellcheck where installed), argument errors exit 2, a machine without a GPU
# exits 3 with one message, the GPU count (a fake nvidia-smi, narrowed by
# CUDA_VISIBLE_DEVICES and --gpus) gives the world sizes of the plan (--dry-run),
# and the summary (--summarize) of a run's outputs has the figures and failures.
#   tests/gpu_acceptance_test.sh SCRIPT
set -uo pipefail
script=$1
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() {  # check NAME WANT_CODE WANT_TEXT -- command...
  local name=$1 want=$2 text=$3
  shift 4
  local got code=0
  got=$("$@" 2>&1) || code=$?
  if [ "$code" != "$want" ] || ! grep -qF -- "$text" <<<"$got"; then
    echo "FAIL $name: exit $code (want $want), output lacks '$text':"
    while IFS= read -r line; do echo "    $line"; done <<<"$got"
    fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}

bash -n "$script" || { echo "FAIL: bash -n $script"; exit 1; }
if command -v shellcheck >/dev/null; then
  shellcheck "$script" || fails=$((fails + 1))
else
  echo "note: shellcheck not installed, only bash -n checked the syntax"
fi

cat >"$tmp/nvidia-smi" <<'SMI'
#!/bin/sh
for i in 0 1 2 3; do echo "GPU $i: NVIDIA Fake 80GB (UUID: GPU-0000000$i)"; done
SMI
chmod +x "$tmp/nvidia-smi"
fake=(env -u CUDA_VISIBLE_DEVICES NVIDIA_SMI="$tmp/nvidia-smi")

check help 0 "--dry-run" -- "$script" --help
check unknown-arg 2 "unknown argument '--frobnicate'" -- "$script" --frobnicate
check gpus-not-a-count 2 "--gpus: expected a count >= 1, got 'x'" -- "$script" --gpus x
check gpus-missing-value 2 "--gpus needs a value" -- "$script" --gpus
check bad-precision 2 "'fp8' is not fp32, bf16 or fp16" -- "$script" --precisions "bf16 fp8"
check no-driver 3 "no GPU found: '$tmp/none' is not installed" -- env NVIDIA_SMI="$tmp/none" "$script" --dry-run
check all-hidden 3 "no GPU found: CUDA_VISIBLE_DEVICES='' hides all 4 GPU(s)" -- \
  env NVIDIA_SMI="$tmp/nvidia-smi" CUDA_VISIBLE_DEVICES= "$script" --dry-run
check four-gpus 0 "4 GPU(s) on $(hostname); world sizes: 1 4; precisions: fp32 bf16 fp16" -- \
  "${fake[@]}" "$script" --dry-run
check visible-two 0 "world sizes: 1 2" -- \
  env NVIDIA_SMI="$tmp/nvidia-smi" CUDA_VISIBLE_DEVICES=1,3 "$script" --dry-run
check gpus-three 0 "world 3: quickstart (nccl); resnet50-bf16 ddp-bf16; adaptive" -- \
  "${fake[@]}" "$script" --dry-run --gpus 3 --precisions bf16
check too-many 2 "--gpus 5, but only 4 GPU(s) are visible" -- "${fake[@]}" "$script" --dry-run --gpus 5
check budget-not-a-count 2 "--budget-s: expected seconds >= 1, got '10m'" -- "$script" --budget-s 10m
check budget-plan 0 "budget: 300 s (a step that would not fit is skipped)" -- \
  "${fake[@]}" "$script" --dry-run --budget-s 300
# A budget nothing fits in: every step skipped and recorded, the run passes, the
# summary lists them (a fake binary and venv: no step runs).
mkdir -p "$tmp/b/launcher" "$tmp/venv/bin"
printf '#!/bin/sh\necho "batchdist 0.1.0 (fake)"\n' >"$tmp/b/launcher/batchdist"
chmod +x "$tmp/b/launcher/batchdist"
ln -s "$(command -v python3)" "$tmp/venv/bin/python"
check venv-without-python 2 "--venv $tmp has no bin/python" -- \
  "${fake[@]}" "$script" --gpus 1 --skip-build --build-dir "$tmp/b" --venv "$tmp" --out "$tmp/o0"
check budget-all-skipped 0 "gpu_acceptance: PASSED (8 step(s) skipped for the time budget: world 1 quickstart, world 1 resnet50-fp32" -- \
  "${fake[@]}" "$script" --gpus 1 --skip-build --build-dir "$tmp/b" --venv "$tmp/venv" --budget-s 1 --out "$tmp/o1"
check budget-skipped-json 0 '"why": "did not fit in the time budget (--budget-s)"' -- cat "$tmp/o1/summary.json"
# The outputs of a 1-GPU bf16 run as the steps leave them.
run="$tmp/run"
mkdir -p "$run/w1/quickstart" "$run/w1/resnet50-bf16" "$run/w1/ddp-bf16" "$run/w1/adaptive"
echo "batchdist 0.1.0 (torch 2.14.1, CUDA 13.0, NCCL 2.30.7, backends: gloo nccl)" >"$run/version.txt"
echo 1 >"$run/gpus.txt"
echo '{"backend": "nccl", "device": "cuda:0", "eval_accuracy": 0.97, "samples_per_s": 9000}' \
  >"$run/w1/quickstart/report.json"
cat >"$run/w1/resnet50-bf16/report.json" <<'JSON'
{"samples_per_s": 2400.0, "memory": {"peak_mb": 38000, "total_mb": 81000},
 "time_breakdown": {"data_wait_fraction": 0.03}}
JSON
cat >"$run/w1/resnet50-bf16/search.json" <<'JSON'
{"chosen": 256, "why": "smallest within 5 %", "seconds": 80, "timed_steps": 30, "memory_budget_mb": 72900,
 "candidates": [
  {"per_gpu_batch": 128, "samples_per_s": 2300, "peak_memory_mb": 20000, "failed": false, "reason": "", "chosen": false},
  {"per_gpu_batch": 256, "samples_per_s": 2400, "peak_memory_mb": 38000, "failed": false, "reason": "", "chosen": true},
  {"per_gpu_batch": 384, "samples_per_s": 0, "peak_memory_mb": 75000, "failed": true, "reason": "over memory budget", "chosen": false},
  {"per_gpu_batch": 512, "samples_per_s": 0, "peak_memory_mb": 0, "failed": true, "reason": "out of memory", "chosen": false}]}
JSON
cat >"$run/w1/adaptive/report.json" <<'JSON'
{"backend": "nccl", "device": "cuda:0", "eval_accuracy": 0.812, "samples_per_s": 120000, "progress": 3600,
 "global_batch": 256, "batch_history": [
  {"step": 0, "global_batch": 32, "why": "start at G0"},
  {"step": 1200, "global_batch": 256, "why": "global batch 32 (16 x 2 x 1) -> 256 (256 x 1 x 1): B_simple 430"},
  {"step": 1300, "global_batch": 256, "why": "global batch stays 256 (256 x 1 x 1): best 256 is within the 5 % margin"}]}
JSON
printf 'x\nsamples_per_s 2500.0\n' >"$run/w1/ddp-bf16/log"
touch "$run/w1/quickstart/log" "$run/w1/resnet50-bf16/log" "$run/w1/adaptive/log"
printf 'world\tstep\tcode\tseconds\tdir\n1\tquickstart\t0\t9\t%s\n1\tresnet50-bf16\t0\t99\t%s\n1\tddp-bf16\t0\t40\t%s\n1\tadaptive\t0\t30\t%s\n' \
  "$run/w1/quickstart" "$run/w1/resnet50-bf16" "$run/w1/ddp-bf16" "$run/w1/adaptive" >"$run/steps.tsv"
check summary 0 "world 1 resnet50-bf16: batch 256/GPU, 2400 img/s (0.96 x DDP), peak 38000 of 72900 MB budget, OOM at 384, data wait 3.0 %" -- \
  "$script" --summarize "$run"
check summary-adaptive 0 "world 1 adaptive: global batch 32 -> 256 (1 change(s)), accuracy 81.20 %, 120000 samples/s" -- \
  "$script" --summarize "$run"
check summary-json 0 '"oom_boundary_batch": 384' -- cat "$run/summary.json"
check summary-ok 0 '"ok": true' -- cat "$run/summary.json"
printf 'x\nTraceback: CUDA error\n' >"$run/w1/ddp-bf16/log"
check summary-failed 1 "gpu_acceptance: FAILED: world 1 ddp-bf16" -- "$script" --summarize "$run"
echo '{"backend": "nccl", "eval_accuracy": 0.8}' >"$run/w1/adaptive/report.json"
check summary-no-history 1 "gpu_acceptance: FAILED: world 1 ddp-bf16, world 1 adaptive" -- "$script" --summarize "$run"
check summary-no-history-why 0 "expected backend nccl and a batch_history in report.json" -- cat "$run/summary.json"

[ "$fails" = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all checks passed"

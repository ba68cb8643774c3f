#!/usr/bin/env bash
# The parts of bench/gpu_acceptance.sh that need no GPU: the script parses
# (shellcheck: the shell_scripts_lint test), argument errors exit 2, a machine without a GPU
# exits 3 with one message, the GPU count (a fake nvidia-smi, narrowed by
# CUDA_VISIBLE_DEVICES and --gpus) gives the world sizes of the plan (--dry-run),
# which lists every step in order with its estimate and, under --budget-s, what the
# estimates leave out (the tail, never the head); a run with fake mpirun, torchrun,
# ctest, cmake and batchdist_make_data runs the steps in that order with the right
# commands (the oom step's batch from the search, the pipeline's from its chosen
# batch, the memory formats of the ResNet-50 pairs, GPT-2 small on both sides at
# one batch, the lever search's memory fraction, the trace read again, the
# optimizer bench built, gloo2 on 2 ranks) and a budget that cuts it skips the
# tail; and the summary (--summarize) of a run's outputs, fabricated for every
# step, has the figures (MFU, tokens/s, the levers, NVML) and failures.
# What this machine has installed changes nothing here: the run's photos step is
# told --photos-from patterns, and bench/gpu_photos.py's own choice (auto: photos
# where PIL, numpy and scikit-image's photos are, else patterns; the fallback
# interpreter) is checked with an interpreter that has none of them (python3 -I -S).
# The photos path itself: the gpu_photos_real test.
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

cat >"$tmp/nvidia-smi" <<'SMI'
#!/bin/sh
case $1 in
  -L) for i in 0 1 2 3; do echo "GPU $i: NVIDIA Fake 80GB (UUID: GPU-0000000$i)"; done ;;
  *) echo "NVIDIA Fake 80GB, 81559 MiB" ;;
esac
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
check gpus-three 0 "world 3: quickstart (nccl); resnet50-bf16 ddp-bf16; trace; resnet50-bf16-cl ddp-bf16-cl; gpt2-bf16 ddp-gpt2-bf16; levers; adaptive" -- \
  "${fake[@]}" "$script" --dry-run --gpus 3 --precisions bf16
check photos-not-a-count 2 "--photos: expected a count >= 1, got '0'" -- "$script" --photos 0
check photos-from-bad 2 "--photos-from: 'jpeg' is not auto, photos or patterns" -- "$script" --photos-from jpeg
check oom-batch-not-a-count 2 "--oom-batch: expected a count >= 1, got 'big'" -- "$script" --oom-batch big
check gpt-batch-not-a-count 2 "--gpt-batch: expected a count >= 1, got '0'" -- "$script" --gpt-batch 0
check lever-fraction-bad 2 "--lever-fraction: expected a fraction in (0, 1], got '1.5'" -- "$script" --lever-fraction 1.5
check lever-fraction-zero 2 "--lever-fraction: expected a fraction in (0, 1], got '0.0'" -- "$script" --lever-fraction 0.0
# The order is the value (issue 61): NCCL, resume, the unit tests; ResNet-50 against
# DDP contiguous then channels-last (the trace of the first read between them);
# GPT-2 small against DDP; the lever search; fp16; the optimizer bench; then what
# the first GPU run measured already, and the adaptive batch last.
check plan-world-1 0 "world 1: quickstart (nccl); resume; unit-tests; resnet50-bf16 ddp-bf16; trace; resnet50-bf16-cl ddp-bf16-cl; gpt2-bf16 ddp-gpt2-bf16; levers; resnet50-fp16-cl ddp-fp16-cl; optimizer-step; oom; resnet50-fp32-cl ddp-fp32-cl; photos pipeline data-verb; gloo2; adaptive" -- \
  "${fake[@]}" "$script" --dry-run
check plan-world-4 0 "world 4: quickstart (nccl); resnet50-bf16 ddp-bf16; trace; resnet50-bf16-cl ddp-bf16-cl; gpt2-bf16 ddp-gpt2-bf16; levers; resnet50-fp16-cl ddp-fp16-cl; resnet50-fp32-cl ddp-fp32-cl; adaptive" -- \
  "${fake[@]}" "$script" --dry-run
check plan-estimates 0 "estimates (s): quickstart 10, resume 20, unit-tests 150, resnet50-bf16 60, ddp-bf16 40, trace 10, resnet50-bf16-cl 60, ddp-bf16-cl 40, gpt2-bf16 35, ddp-gpt2-bf16 30, levers 50, resnet50-fp16-cl 60, ddp-fp16-cl 40, optimizer-step 50, oom 35, resnet50-fp32-cl 60, ddp-fp32-cl 40, photos 20, pipeline 30, data-verb 20, gloo2 10, adaptive 90; in all 960" -- \
  "${fake[@]}" "$script" --dry-run
check plan-estimates-world-4 0 "estimates (s): quickstart 10, resnet50-bf16 60, ddp-bf16 40, trace 10, resnet50-bf16-cl 60, ddp-bf16-cl 40, gpt2-bf16 35, ddp-gpt2-bf16 30, levers 50, resnet50-fp16-cl 60, ddp-fp16-cl 40, resnet50-fp32-cl 60, ddp-fp32-cl 40, adaptive 90; in all 625" -- \
  "${fake[@]}" "$script" --dry-run
check plan-estimates-args 0 "estimates (s): quickstart 10, resume 20, unit-tests 150, resnet50-bf16 48, ddp-bf16 30, trace 10, resnet50-bf16-cl 48, ddp-bf16-cl 30, gpt2-bf16 35, ddp-gpt2-bf16 30, levers 50, resnet50-fp16-cl 48, ddp-fp16-cl 30, optimizer-step 50, oom 35, resnet50-fp32-cl 48, ddp-fp32-cl 30, photos 30, pipeline 25" -- \
  "${fake[@]}" "$script" --dry-run --steps 20 --samples 30000 --photos 2000 --gpt-batch 32
check plan-without-bf16 0 "world 1: quickstart (nccl); resume; unit-tests; resnet50-fp32 ddp-fp32; trace; resnet50-fp32-cl ddp-fp32-cl; gpt2-fp32 ddp-gpt2-fp32; levers; resnet50-fp16-cl ddp-fp16-cl; optimizer-step; oom; photos pipeline data-verb; gloo2; adaptive" -- \
  "${fake[@]}" "$script" --dry-run --gpus 1 --precisions " fp32  fp16 "
check plan-fp16-primary 0 "world 1: quickstart (nccl); resume; unit-tests; resnet50-fp16 ddp-fp16; trace; resnet50-fp16-cl ddp-fp16-cl; gpt2-fp16 ddp-gpt2-fp16; levers; optimizer-step; oom; resnet50-fp32-cl ddp-fp32-cl; photos pipeline data-verb; gloo2; adaptive" -- \
  "${fake[@]}" "$script" --dry-run --gpus 1 --precisions "fp16 fp32"
check too-many 2 "--gpus 5, but only 4 GPU(s) are visible" -- "${fake[@]}" "$script" --dry-run --gpus 5
check budget-not-a-count 2 "--budget-s: expected seconds >= 1, got '10m'" -- "$script" --budget-s 10m
check budget-plan 0 "budget: 300 s (the first step that would not fit is skipped, and the rest of its world's plan)" -- \
  "${fake[@]}" "$script" --dry-run --budget-s 300
# What 600 s keeps by the estimates: the head through the lever search (505 s);
# the tail from fp16 on is skipped, and it is the plan's tail: every step after the
# first skipped one is skipped too.
check budget-600 0 "within 600 s by the estimates (the build not counted): 11 step(s) run, to 505 s; the tail skipped: resnet50-fp16-cl ddp-fp16-cl optimizer-step oom resnet50-fp32-cl ddp-fp32-cl photos pipeline data-verb gloo2 adaptive" -- \
  "${fake[@]}" "$script" --dry-run --gpus 1 --budget-s 600
budget_tail() {  # the plan's estimates line and the skipped list: is the list its end?
  local plan tail
  plan=$("${fake[@]}" "$script" --dry-run --gpus 1 "$@" | sed -n 's/^    estimates (s): \(.*\); in all .*/\1/p' |
         sed 's/ [0-9][0-9]*,\{0,1\}//g')
  tail=$("${fake[@]}" "$script" --dry-run --gpus 1 "$@" | sed -n 's/.*; the tail skipped: //p')
  [ -n "$tail" ] && [ "${plan% "$tail"}" != "$plan" ] && [ "$tail" != "$plan" ] &&
    echo "the tail: $tail" || echo "not the tail: '$tail' of '$plan'"
}
check budget-600-is-tail 0 "the tail: resnet50-fp16-cl" -- budget_tail --budget-s 600
check budget-450-is-tail 0 "the tail: gpt2-bf16" -- budget_tail --budget-s 450 --skip-build
check budget-800-is-tail 0 "the tail: photos pipeline data-verb gloo2 adaptive" -- budget_tail --budget-s 800
# A budget nothing fits in: every step skipped and recorded, the run passes, the
# summary lists them (a fake binary and venv: no step runs).
mkdir -p "$tmp/b/launcher" "$tmp/venv/bin"
printf '#!/bin/sh\necho "batchdist 0.1.0 (fake)"\n' >"$tmp/b/launcher/batchdist"
chmod +x "$tmp/b/launcher/batchdist"
# The interpreter itself, as a venv's bin/python is, not a launcher's shim (pyenv's
# costs 0.1 s a start, and the script starts Python after every step).
py3=$(python3 -c 'import sys; print(sys.executable)')
ln -s "$py3" "$tmp/venv/bin/python"
check venv-without-python 2 "--venv $tmp has no bin/python" -- \
  "${fake[@]}" "$script" --gpus 1 --skip-build --build-dir "$tmp/b" --venv "$tmp" --out "$tmp/o0"
check budget-all-skipped 0 "gpu_acceptance: PASSED (22 step(s) skipped, for the time budget or a step they need: world 1 quickstart, world 1 resume, world 1 unit-tests, world 1 resnet50-bf16, world 1 ddp-bf16, world 1 trace, world 1 resnet50-bf16-cl, world 1 ddp-bf16-cl, world 1 gpt2-bf16, world 1 ddp-gpt2-bf16, world 1 levers, world 1 resnet50-fp16-cl, world 1 ddp-fp16-cl, world 1 optimizer-step, world 1 oom, world 1 resnet50-fp32-cl, world 1 ddp-fp32-cl, world 1 photos, world 1 pipeline, world 1 data-verb, world 1 gloo2, world 1 adaptive)" -- \
  "${fake[@]}" "$script" --gpus 1 --skip-build --build-dir "$tmp/b" --venv "$tmp/venv" --budget-s 1 --out "$tmp/o1"
check budget-skipped-json 0 '"why": "did not fit in the time budget (--budget-s)"' -- cat "$tmp/o1/summary.json"
check budget-skipped-estimate 0 '"estimate_s": 150' -- cat "$tmp/o1/summary.json"
check budget-skipped-pair 0 '"estimate_s": 65' -- cat "$tmp/o1/summary.json"
check budget-skipped-needs 0 '"why": "the photos step made no image folder"' -- cat "$tmp/o1/summary.json"
check budget-skipped-trace 0 '"why": "resnet50-bf16 left no profiler trace"' -- cat "$tmp/o1/summary.json"

# Every step run, in the plan's order, by fakes: mpirun prints its arguments (and
# leaves a search.json where a search would run: batches 128 and 256 fit, 384 ran
# out of memory; a profiler trace and NVML's points where the run traces; GPT-2's
# report with its memory),
# torchrun a DDP rate, ctest a run with one failure, cmake a bench that prints its
# figures, make_data one picture per class. Nothing measures anything; the
# commands are what is checked.
fb="$tmp/fakebin"
mkdir -p "$fb" "$tmp/b/tests"
cat >"$fb/mpirun" <<'SH'
#!/bin/bash
echo "fake mpirun $*"
o="" auto=0 traced=0
while [ $# -gt 0 ]; do
  case $1 in --output) o=$2; shift ;; batch.per_gpu=auto) auto=1 ;; profile.active=3) traced=1 ;; esac
  shift
done
if [ "$auto" = 1 ] && [[ $o == */resnet50-* ]]; then
  mkdir -p "$o"
  echo '{"chosen": 256, "candidates": [
    {"per_gpu_batch": 128, "failed": false, "reason": ""},
    {"per_gpu_batch": 256, "failed": false, "reason": ""},
    {"per_gpu_batch": 384, "failed": true, "reason": "out of memory on rank 0"}]}' >"$o/search.json"
fi
if [[ $o == */gpt2-* ]]; then  # what the levers step's memory fraction is taken from
  mkdir -p "$o"
  echo '{"per_gpu_batch": 16, "tokens_per_s": 350000, "memory": {"peak_mb": 20000, "total_mb": 81000,
    "parameters_mb": 500, "gradients_mb": 500, "optimizer_state_mb": 1000}}' >"$o/report.json"
fi
if [ "$traced" = 1 ]; then
  mkdir -p "$o/profile"
  echo '{"traceEvents": [
    {"ph": "X", "name": "ProfilerStep#13", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "name": "sm90_xmma_gemm_bf16", "cat": "kernel", "pid": 0, "tid": 7, "ts": 10, "dur": 50},
    {"ph": "X", "name": "elementwise_kernel", "cat": "kernel", "pid": 0, "tid": 7, "ts": 60, "dur": 20}]}' \
    >"$o/profile/vm_rank0.pt.trace.json"
  echo '{"kind": "step", "step": 20, "gpu_util_pct": 97.5, "gpu_memory_used_mb": 40000, "gpu_power_w": 612}' \
    >"$o/metrics.jsonl"
fi
SH
cat >"$tmp/venv/bin/torchrun" <<'SH'
#!/bin/sh
echo "fake torchrun $*"; echo "samples_per_s 2500.0"
case " $* " in *" --model gpt "*) echo "tokens_per_s 2560000.0" ;; esac
SH
cat >"$fb/ctest" <<'SH'
#!/bin/sh
echo "fake ctest in $PWD: $*"
echo "      Start  1: Config.Parses"
echo " 1/3 Test  #1: Config.Parses ....................   Passed    0.02 sec"
echo " 2/3 Test  #2: Cli.NoGpuIsBadInput ..............***Failed    0.31 sec"
echo " 3/3 Test  #3: mpi_tests_np2 ....................   Passed   12.50 sec"
echo ""
echo "67% tests passed, 1 tests failed out of 3"
echo ""
echo "Total Test time (real) =  12.90 sec"
echo ""
echo "The following tests FAILED:"
echo "	  2 - Cli.NoGpuIsBadInput (Failed)"
exit 8
SH
cat >"$fb/cmake" <<'SH'
#!/bin/sh
echo "fake cmake $*"
mkdir -p "$2/bench"
cat >"$2/bench/batchdist_optimizer_step" <<'BENCH'
#!/bin/sh
echo "fake bench $*"
echo "optimizer step, width / 1, cuda, torch threads 16"
echo "adamw  148 tensors  124.4 M params: torch::optim    4.100 ms; batchdist per-tensor    4.050 ms (1.01x), multi-tensor    1.640 ms (2.50x); median of 15"
echo "sgd    161 tensors   25.6 M params: torch::optim    2.000 ms; batchdist per-tensor    2.020 ms (0.99x), multi-tensor    0.800 ms (2.50x); median of 15"
BENCH
chmod +x "$2/bench/batchdist_optimizer_step"
SH
cat >"$tmp/b/tests/batchdist_make_data" <<'SH'
#!/bin/sh
for c in c0_cat c1_dog; do mkdir -p "$2/train/$c" && printf 'not a jpeg' >"$2/train/$c/000000.jpg"; done
SH
chmod +x "$fb/mpirun" "$fb/ctest" "$fb/cmake" "$tmp/venv/bin/torchrun" "$tmp/b/tests/batchdist_make_data"
printf 'CMAKE_CTEST_COMMAND:INTERNAL=%s\nCMAKE_COMMAND:INTERNAL=%s\n' "$fb/ctest" "$fb/cmake" >"$tmp/b/CMakeCache.txt"
e2e="$tmp/o2"
check fakes-run 1 "gpu_acceptance: FAILED: world 1 quickstart" -- \
  env PATH="$fb:$PATH" "${fake[@]}" "$script" --gpus 1 --precisions "fp32 bf16 fp16" --photos 8 --photos-from patterns --skip-build \
  --build-dir "$tmp/b" --venv "$tmp/venv" --budget-s 600 --out "$e2e"
check fakes-order 0 "quickstart resume unit-tests resnet50-bf16 ddp-bf16 trace resnet50-bf16-cl ddp-bf16-cl gpt2-bf16 ddp-gpt2-bf16 levers resnet50-fp16-cl ddp-fp16-cl optimizer-step oom resnet50-fp32-cl ddp-fp32-cl photos pipeline data-verb gloo2 adaptive" -- \
  bash -c 'tail -n +2 "$1" | cut -f2 | tr "\n" " "' _ "$e2e/steps.tsv"
check fakes-none-skipped 0 "0 skipped" -- bash -c 'echo "$(grep -c skipped "$1") skipped"' _ "$e2e/steps.tsv"
check fakes-resnet-contiguous 0 "--set batch.per_gpu=auto --set train.precision=bf16 --set train.memory_format=contiguous" -- \
  cat "$e2e/w1/resnet50-bf16/log"
check fakes-resnet-traced 0 "--set profile.wait=10" -- cat "$e2e/w1/resnet50-bf16/log"
check fakes-resnet-channels-last 0 "--set train.precision=bf16 --set train.memory_format=channels_last" -- \
  cat "$e2e/w1/resnet50-bf16-cl/log"
check fakes-resnet-fp16 0 "--set train.precision=fp16 --set train.memory_format=channels_last" -- \
  cat "$e2e/w1/resnet50-fp16-cl/log"
check fakes-ddp-batch 0 "--precision bf16 --per-gpu-batch 256 --classes 100 --steps 40" -- cat "$e2e/w1/ddp-bf16/log"
check fakes-ddp-channels-last 0 "--precision bf16 --per-gpu-batch 256 --classes 100 --channels-last --steps 40" -- \
  cat "$e2e/w1/ddp-bf16-cl/log"
check fakes-trace 0 "trace: 2 kernel events, 0 NCCL kernel(s), 0 NCCL host event(s); 1 GPU: no NCCL kernel" -- \
  cat "$e2e/w1/trace/log"
check fakes-trace-nvml 0 "NVML (1 points): GPU 97.5 %, 40000 MB, 612 W" -- cat "$e2e/w1/trace/log"
check fakes-tokens 0 "8388610 2" -- bash -c 'echo "$(stat -c %s "$1/train.bin") $(ls "$1" | wc -l)"' _ "$e2e/tokens"
check fakes-gpt2 0 "configs/gpt2-small.yaml -q --set train.device=cuda --set dist.backend=nccl --set data.path=$e2e/tokens/train.bin --set data.val_path=$e2e/tokens/val.bin --set batch.global_tokens=0 --set batch.global=16 --set batch.per_gpu=16 --set train.precision=bf16 --set train.max_steps=40" -- \
  cat "$e2e/w1/gpt2-bf16/log"
check fakes-ddp-gpt2 0 "--model gpt --device cuda --precision bf16 --per-gpu-batch 16 --tokens $e2e/tokens/train.bin --layers 12 --heads 12 --embed 768 --vocab 50304 --seq-len 1024 --dropout 0 --lr 0.0006 --beta1 0.9 --beta2 0.95 --weight-decay 0.1 --clip-grad-norm 1.0" -- \
  cat "$e2e/w1/ddp-gpt2-bf16/log"
check fakes-levers 0 "batchdist search $(cd "$(dirname "$script")/.." && pwd)/configs/gpt2-small.yaml" -- cat "$e2e/w1/levers/log"
check fakes-levers-args 0 "--set batch.global=64 --set batch.per_gpu=auto --set dist.shard=auto --set model.recompute=auto --set search.memory_fraction=0.2191 --set train.precision=bf16" -- \
  cat "$e2e/w1/levers/log"
check fakes-levers-why 0 "7/8 of the way from gpt2's fixed memory (2000 MB) to its peak at per-GPU 16 (20000 MB): 17750 MB of 81000" -- \
  cat "$e2e/w1/levers/request.json"
check fakes-optimizer-build 0 "fake cmake --build $tmp/b --target batchdist_optimizer_step -j" -- cat "$e2e/w1/optimizer-step/log"
check fakes-optimizer-run 0 "fake bench 1 15 cuda" -- cat "$e2e/w1/optimizer-step/log"
check fakes-oom-batch 0 "--set batch.per_gpu=512 --set train.precision=bf16 --set train.device=cuda --set dist.backend=nccl" -- \
  cat "$e2e/w1/oom/log"
check fakes-oom-why 0 "twice the largest per-GPU batch that fit in resnet50-bf16's search (256; the smallest that ran out of memory there: 384)" -- \
  cat "$e2e/w1/oom/request.json"
check fakes-resume 0 "checkpoint.every_steps=50" -- cat "$e2e/w1/resume/full.log"
check fakes-photos 0 '"source": "patterns"' -- cat "$e2e/w1/photos/folder/photos.json"
check fakes-photos-forced 0 '"why_not_photos": "--source patterns"' -- cat "$e2e/w1/photos/folder/photos.json"
check fakes-photos-command 0 "--make-data $tmp/b/tests/batchdist_make_data --source patterns" -- cat "$e2e/w1/photos/log"
check fakes-pipeline 0 "--set batch.per_gpu=256 --set batch.global=256 --set data.workers=auto --set train.precision=bf16" -- \
  cat "$e2e/w1/pipeline/log"
check fakes-data-verb 0 "data.workers=$(( $(nproc) > 1 ? $(nproc) - 1 : 1 )) --seconds 10 --json" -- cat "$e2e/w1/data-verb/log"
check fakes-gloo2 0 "-np 2 -x CUDA_VISIBLE_DEVICES=0 $tmp/b/launcher/batchdist" -- cat "$e2e/w1/gloo2/log"
check fakes-gloo2-backend 0 "--set train.device=cuda --set dist.backend=gloo" -- cat "$e2e/w1/gloo2/log"
check fakes-ctest 0 "fake ctest in $tmp/b: -L cuda_leg -j" -- cat "$e2e/w1/unit-tests/log"
check fakes-summary-tests 1 "world 1 unit-tests (FAILED): 2 of 3 passed, 1 failed, 0 crashed, 0 skipped (Cli.NoGpuIsBadInput (Failed))" -- \
  "$script" --summarize "$e2e"
check fakes-summary-trace 1 "world 1 trace: 2 GPU kernel events in steps [13], 0 NCCL kernel(s) (1 GPU: no NCCL kernel in the traced steps (nothing to reduce across one rank)); NVML at most: GPU 98 %, 40000 MB, 612 W" -- \
  "$script" --summarize "$e2e"
check fakes-summary-optimizer 1 "world 1 optimizer-step: adamw (148 tensors, 124.4 M): per-tensor 1.01x, multi-tensor 2.5x torch::optim (4.1 ms); sgd (161 tensors, 25.6 M): per-tensor 0.99x, multi-tensor 2.5x torch::optim (2.0 ms)" -- \
  "$script" --summarize "$e2e"
# A budget the run outgrows at unit-tests (150 s): quickstart and resume run, then
# the rest of the plan is skipped, the tail, even the steps that would fit alone.
check budget-cut-run 1 "gpu_acceptance: FAILED: world 1 quickstart, world 1 resume (20 step(s) skipped, for the time budget or a step they need: world 1 unit-tests, world 1 resnet50-bf16, world 1 ddp-bf16, world 1 trace," -- \
  env PATH="$fb:$PATH" "${fake[@]}" "$script" --gpus 1 --precisions "fp32 bf16 fp16" --photos 8 --photos-from patterns --skip-build \
  --build-dir "$tmp/b" --venv "$tmp/venv" --budget-s 100 --out "$tmp/o3"
check budget-cut-ran 0 "quickstart:0 resume:1 unit-tests:skipped resnet50-bf16:skipped" -- \
  bash -c 'tail -n +2 "$1" | cut -f2,3 | tr "\t\n" ": "' _ "$tmp/o3/steps.tsv"
check budget-cut-tail 0 "gloo2:skipped adaptive:skipped" -- \
  bash -c 'tail -n +2 "$1" | cut -f2,3 | tr "\t\n" ": "' _ "$tmp/o3/steps.tsv"
check budget-cut-why 0 '"why": "did not fit in the time budget (--budget-s)"' -- \
  python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["runs"][0]["gloo2"]))' "$tmp/o3/summary.json"
# bench/gpu_photos.py's choice under --source auto and photos, made by an
# interpreter without PIL, numpy or scikit-image whatever this machine has: no
# site-packages (-S), no PYTHON* variables or user site (-I).
photos=$(dirname "$script")/gpu_photos.py
bare=$tmp/bare-python
printf '#!/bin/sh\nexec %q -I -S "$@"\n' "$py3" >"$bare"
cp "$bare" "$tmp/bare-fallback"
chmod +x "$bare" "$tmp/bare-fallback"
check photos-bare-python 1 "No module named 'numpy'" -- "$bare" -c 'import numpy'
check photos-auto-patterns 0 "gpu_photos: no photos ($py3 has no numpy (photo_folder.py needs PIL and numpy)); writing patterns instead" -- \
  "$bare" "$photos" "$tmp/p1" --count 8 --repeat 1 --make-data "$tmp/b/tests/batchdist_make_data" --fallback-python ""
check photos-auto-json 0 '"source": "patterns"' -- cat "$tmp/p1/photos.json"
check photos-forced-fails 1 "gpu_photos: --source photos, but no photos: " -- \
  "$bare" "$photos" "$tmp/p2" --count 8 --make-data "$tmp/b/tests/batchdist_make_data" --source photos --fallback-python ""
check photos-fallback-tried 1 "has no numpy (photo_folder.py needs PIL and numpy); trying $tmp/bare-fallback" -- \
  "$bare" "$photos" "$tmp/p3" --count 8 --source photos --fallback-python "$tmp/bare-fallback"

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
# The channels-last pair and fp16's, with the figures of the model's arithmetic
# (report.json mfu, flops_per_sample, peak_tflops; DDP's MFU is recomputed with
# batchdist's FLOPs and peak), and GPT-2 small's pair.
mkdir -p "$run/w1/resnet50-bf16-cl" "$run/w1/ddp-bf16-cl" "$run/w1/resnet50-fp16-cl" "$run/w1/ddp-fp16-cl" \
  "$run/w1/gpt2-bf16" "$run/w1/ddp-gpt2-bf16"
for r in bf16-cl fp16-cl; do
  sed 's/"chosen": 256/"chosen": 512/; s/"per_gpu_batch": 512, "samples_per_s": 0/"per_gpu_batch": 768, "samples_per_s": 0/' \
    "$run/w1/resnet50-bf16/search.json" >"$run/w1/resnet50-$r/search.json"
done
cat >"$run/w1/resnet50-bf16-cl/report.json" <<'JSON'
{"samples_per_s": 3300.0, "memory": {"peak_mb": 52000, "total_mb": 81000}, "memory_format": "channels_last",
 "mfu": 0.081, "flops_per_sample": 2.43e10, "peak_tflops": 989.4, "peak_source": "NVIDIA H100 80GB HBM3: bf16 dense",
 "time_breakdown": {"data_wait_fraction": 0.01}}
JSON
sed 's/"samples_per_s": 3300.0/"samples_per_s": 3100.0/; s/"mfu": 0.081/"mfu": 0.076/' "$run/w1/resnet50-bf16-cl/report.json" |
  python3 -c 'import json, sys; r = json.load(sys.stdin); r["loss_scaler"] = {"scale": 32768.0, "skipped_steps": 2}; print(json.dumps(r))' \
  >"$run/w1/resnet50-fp16-cl/report.json"
printf 'samples_per_s 3000.0\nflops_per_sample 2.43e+10\npeak_tflops 989.4 (NVIDIA H100 80GB HBM3: dense bf16 tensor peak)\nmfu 0.0737\n' \
  >"$run/w1/ddp-bf16-cl/log"
printf 'samples_per_s 2900.0\n' >"$run/w1/ddp-fp16-cl/log"
cat >"$run/w1/gpt2-bf16/report.json" <<'JSON'
{"precision": "bf16", "per_gpu_batch": 16, "accum_steps": 1, "tokens_per_step": 16384, "samples_per_s": 341.8,
 "tokens_per_s": 350000.0, "train_loss": 10.9, "recompute": "off", "shard": "none", "plan": {"tokens_per_sample": 1024},
 "memory": {"peak_mb": 20000, "total_mb": 81000, "parameters_mb": 500, "gradients_mb": 500, "optimizer_state_mb": 1000,
            "rest_mb": 18000},
 "mfu": 0.3026, "flops_per_sample": 8.759e11, "peak_tflops": 989.4, "peak_source": "NVIDIA H100 80GB HBM3: bf16 dense"}
JSON
printf 'samples_per_s 330.0\ntokens_per_s 337920.0\nflops_per_sample 8.759e+11\npeak_tflops 989.4 (x)\nmfu 0.2921\n' \
  >"$run/w1/ddp-gpt2-bf16/log"
touch "$run/w1/quickstart/log" "$run/w1/resnet50-bf16/log" "$run/w1/adaptive/log" "$run/w1/resnet50-bf16-cl/log" \
  "$run/w1/resnet50-fp16-cl/log" "$run/w1/gpt2-bf16/log"
printf 'world\tstep\tcode\tseconds\tdir\n' >"$run/steps.tsv"
for s in quickstart resnet50-bf16 ddp-bf16 resnet50-bf16-cl ddp-bf16-cl gpt2-bf16 ddp-gpt2-bf16 resnet50-fp16-cl \
         ddp-fp16-cl adaptive; do
  printf '1\t%s\t0\t30\t%s\n' "$s" "$run/w1/$s" >>"$run/steps.tsv"
done
check summary 0 "world 1 resnet50-bf16: batch 256/GPU, 2400 img/s (0.96 x DDP), peak 38000 of 72900 MB budget, OOM at 384, data wait 3.0 %; memory format ?, MFU ? (DDP ?)" -- \
  "$script" --summarize "$run"
check summary-channels-last 0 "world 1 resnet50-bf16-cl: batch 512/GPU, 3300 img/s (1.1 x DDP), peak 38000 of 72900 MB budget, OOM at 384, data wait 1.0 %; memory format channels_last, MFU 8.1 % (DDP 7.4 %)" -- \
  "$script" --summarize "$run"
check summary-fp16 0 "world 1 resnet50-fp16-cl: batch 512/GPU, 3100 img/s (1.069 x DDP), peak 38000 of 72900 MB budget, OOM at 384, data wait 1.0 %; memory format channels_last, MFU 7.6 % (DDP 7.1 %), loss scale 32768, 2 skipped step(s)" -- \
  "$script" --summarize "$run"
check summary-gpt2 0 "world 1 gpt2-bf16: 16/GPU x 1024 tokens, 350000 tokens/s (1.036 x DDP's 337920), MFU 30.3 % (DDP 29.2 %), peak 20000 MB" -- \
  "$script" --summarize "$run"
json1() {  # the summary's entry of STEP in $run, one key a line
  python3 -c 'import json, sys
e = json.load(open(sys.argv[1]))["runs"][0][sys.argv[2]]
for k, v in e.items(): print(k, json.dumps(v))' "$run/summary.json" "$1"
}
check summary-json-absent-keys 0 'memory_format null' -- json1 resnet50-bf16
check summary-json-absent-mfu 0 'mfu null' -- json1 resnet50-bf16
check summary-json-ddp-mfu-own 0 'ddp_mfu_from null' -- json1 resnet50-bf16
check summary-json-cl-peak 0 'peak_source "NVIDIA H100 80GB HBM3: bf16 dense"' -- json1 resnet50-bf16-cl
check summary-json-cl-ddp-mfu 0 'ddp_mfu_from "batchdist'"'"'s flops_per_sample and peak_tflops"' -- json1 resnet50-bf16-cl
check summary-json-ddp-own-mfu 0 'mfu 0.0737' -- json1 ddp-bf16-cl
check summary-json-ddp-peak 0 'peak_tflops 989.4' -- json1 ddp-bf16-cl
check summary-json-gpt2-ddp 0 'ddp_tokens_per_s 337920.0' -- json1 gpt2-bf16
check summary-json-gpt2-ddp-mfu 0 'ddp_mfu 0.2921' -- json1 gpt2-bf16
check summary-json-gpt2-parts 0 'memory_parts_mb {"parameters_mb": 500, "gradients_mb": 500, "optimizer_state_mb": 1000, "rest_mb": 18000}' -- \
  json1 gpt2-bf16
check summary-json-ddp-gpt2-rate 0 'tokens_per_s 337920.0' -- json1 ddp-gpt2-bf16
check summary-json-fp16-scaler 0 'skipped_steps 2' -- json1 resnet50-fp16-cl
check summary-adaptive 0 "world 1 adaptive: global batch 32 -> 256 (1 change(s)), accuracy 81.20 %, 120000 samples/s" -- \
  "$script" --summarize "$run"
check summary-json 0 '"oom_boundary_batch": 384' -- cat "$run/summary.json"
check summary-ok 0 '"ok": true' -- cat "$run/summary.json"
printf 'x\nTraceback: CUDA error\n' >"$run/w1/ddp-bf16/log"
check summary-failed 1 "gpu_acceptance: FAILED: world 1 ddp-bf16" -- "$script" --summarize "$run"
echo '{"backend": "nccl", "eval_accuracy": 0.8}' >"$run/w1/adaptive/report.json"
check summary-no-history 1 "gpu_acceptance: FAILED: world 1 ddp-bf16, world 1 adaptive" -- "$script" --summarize "$run"
check summary-no-history-why 0 "expected backend nccl and a batch_history in report.json" -- cat "$run/summary.json"
echo '{"precision": "bf16", "per_gpu_batch": 16}' >"$run/w1/gpt2-bf16/report.json"
check summary-gpt2-no-rate 1 "gpu_acceptance: FAILED: world 1 ddp-bf16, world 1 gpt2-bf16, world 1 adaptive" -- \
  "$script" --summarize "$run"
check summary-gpt2-no-rate-why 0 'problem "no tokens_per_s in report.json"' -- json1 gpt2-bf16

# The outputs of the single-GPU steps as they leave them (a 1-GPU run), then each
# step's way of failing, and a run cut at the deadline.
r2="$tmp/run2"
mkdir -p "$r2"/w1/{oom,resume/full,resume/cut,photos/folder,pipeline,data-verb,gloo2,unit-tests,levers,trace,optimizer-step}
cp "$run/version.txt" "$run/gpus.txt" "$r2/"
steps2() {  # CODE of oom resume photos pipeline data-verb gloo2 unit-tests levers trace optimizer-step
  printf 'world\tstep\tcode\tseconds\tdir\n' >"$r2/steps.tsv"
  local s
  for s in oom resume photos pipeline data-verb gloo2 unit-tests levers trace optimizer-step; do
    printf '1\t%s\t%s\t20\t%s\n' "$s" "$1" "$r2/w1/$s" >>"$r2/steps.tsv"
    shift
  done
}
steps2 0 0 0 0 0 0 0 0 0 0
echo '{"memory_fraction": 0.1447, "limit_mb": 11800, "gpu_memory_mb": 81559, "why": "7/8 of the way"}' \
  >"$r2/w1/levers/request.json"
cat >"$r2/w1/levers/search.json" <<'JSON'
{"chosen": 8, "chosen_accum": 8, "why": "the smallest within 5 %", "memory_budget_mb": 11800, "seconds": 31.5,
 "chosen_levers": {"shard": "none", "recompute": "off"},
 "candidates": [
  {"per_gpu_batch": 8, "accum_steps": 8, "samples_per_s": 330, "peak_memory_mb": 9000, "failed": false, "reason": "",
   "levers": {"shard": "none", "recompute": "off"}},
  {"per_gpu_batch": 16, "accum_steps": 4, "samples_per_s": 0, "peak_memory_mb": 15500, "failed": true,
   "reason": "over memory budget", "levers": {"shard": "none", "recompute": "off"}},
  {"per_gpu_batch": 16, "accum_steps": 4, "samples_per_s": 260, "peak_memory_mb": 10900, "failed": false, "reason": "",
   "levers": {"shard": "none", "recompute": "on"}}],
 "levers": [
  {"levers": {"shard": "none", "recompute": "off"}, "fitted": true, "predicted_max_per_gpu": 8,
   "measured_max_per_gpu": 8, "timed": true, "verdict": "the walk's"},
  {"levers": {"shard": "none", "recompute": "on"}, "fitted": true, "predicted_max_per_gpu": 16,
   "measured_max_per_gpu": 16, "timed": true, "verdict": "fits 16, timed"}]}
JSON
cat >"$r2/w1/trace/trace_check.json" <<'JSON'
{"run": "x", "world": 1, "problems": [], "nccl_note": "1 GPU: no NCCL kernel in the traced steps (nothing to reduce across one rank); 3 NCCL host-side event(s)",
 "trace": "x/profile/vm_rank0.pt.trace.json", "events": 90000, "steps": [13, 14, 15], "kernels": 4210,
 "kernel_names": ["sm90_xmma"], "memcpy": 12, "nccl_kernels": 0, "nccl_kernel_names": [], "nccl_events": 3,
 "nccl_event_names": ["nccl:all_reduce"],
 "nvml": {"gpu_util_pct": 99.2, "gpu_memory_used_mb": 45100, "gpu_power_w": 655.5}, "nvml_points": 4,
 "nvml_source": "metrics.jsonl", "nvml_nonzero": true}
JSON
cat >"$r2/w1/optimizer-step/log" <<'LOG'
[100%] Built target batchdist_optimizer_step
optimizer step, width / 1, cuda, torch threads 16
adamw  148 tensors  124.4 M params: torch::optim    4.100 ms; per_tensor    4.050 ms (1.01x); multi_tensor    1.640 ms (2.50x); fused    0.820 ms (5.00x); median of 15
sgd    161 tensors   25.6 M params: torch::optim    2.000 ms; per_tensor    2.020 ms (0.99x); multi_tensor    0.800 ms (2.50x); fused    0.500 ms (4.00x); median of 15
lars   161 tensors   25.6 M params: per-tensor    3.000 ms; per_tensor    3.000 ms (1.00x); multi_tensor    1.000 ms (3.00x); median of 15
LOG
touch "$r2/w1/levers/log" "$r2/w1/trace/log"
echo '{"per_gpu_batch": 1536, "precision": "bf16", "why": "twice the largest per-GPU batch that fit in resnet50-bf16'"'"'s search (768)"}' \
  >"$r2/w1/oom/request.json"
cat >"$r2/w1/oom/report.json" <<'JSON'
{"per_gpu_batch": 768, "accum_steps": 2, "steps": 10, "samples_per_s": 2950.0, "completed": true,
 "oom_backoffs": [{"step": 1, "rank": 0, "ranks": [0], "from": "1536x1", "to": "768x2", "from_per_gpu": 1536,
   "from_accum": 1, "to_per_gpu": 768, "to_accum": 2, "peak_mb": 80100, "capacity_mb": 81559, "retry": false}],
 "memory": {"peak_mb": 70000, "total_mb": 81559, "gpu_utilization": 0.97}}
JSON
echo "oom back-off: out of memory at step 1 on rank 0 with per-GPU batch 1536 x accumulation 1 (peak resident 80100 MB); every rank redoes the step as per-GPU batch 768 x accumulation 2" \
  >"$r2/w1/oom/log"
echo '{"device": "cuda:0", "backend": "nccl", "steps": 200}' >"$r2/w1/resume/full/report.json"
echo '{"device": "cuda:0", "backend": "nccl", "steps": 200, "resumed_from": {"step": 100, "world_size_then": 1}}' \
  >"$r2/w1/resume/cut/report.json"
echo "model_diff: 16 tensors, 0 not bitwise equal, max |a-b| = 0, tolerance 0" >"$r2/w1/resume/diff.txt"
echo "batchdist: BATCHDIST_FAULT_CHECKPOINT=after_rename: killing rank 0" >"$r2/w1/resume/cut.log"
printf 'full: 200 steps, a checkpoint every 50\ncut: killed after the checkpoint at step 100\nok: resumed from step 100, bitwise equal\n' \
  >"$r2/w1/resume/log"
echo '{"source": "photos", "generator": "bench/photo_folder.py", "why_not_photos": null, "files": 1024, "classes": 8,
  "mean_mpx": 0.181, "longer_side_px": [300, 600], "list_entries": 8192}' >"$r2/w1/photos/folder/photos.json"
cat >"$r2/w1/pipeline/report.json" <<'JSON'
{"precision": "bf16", "device": "cuda:0", "per_gpu_batch": 256, "samples_per_s": 2810.0,
 "time_breakdown": {"data_wait_fraction": 0.012},
 "data_pipeline": {"source": "image_folder", "workers": 15, "loader_samples_per_s": 9100.0},
 "data_errors": {"count": 0, "first": []}, "memory": {"gpu_utilization": 0.95}}
JSON
cat >"$r2/w1/data-verb/log" <<'LOG'
== world 1, data-verb: mpirun -np 1 batchdist data configs/resnet50-imagenet.yaml --json
{
  "source": "image_folder",
  "samples": 8192,
  "samples_per_s": 9450.5,
  "bytes_per_s": 4.1e8,
  "workers": 15,
  "per_rank": [
    {
      "rank": 0,
      "samples": 94720,
      "seconds": 10.02,
      "per_gpu": 256
    }
  ],
  "data_errors": 0
}
LOG
echo '{"backend": "gloo", "device": "cuda:0", "world_size": 2, "eval_accuracy": 0.975, "samples_per_s": 3100}' \
  >"$r2/w1/gloo2/report.json"
touch "$r2/w1/photos/log" "$r2/w1/pipeline/log" "$r2/w1/gloo2/log"
cat >"$r2/w1/unit-tests/log" <<'LOG'
 1/3 Test  #1: Config.Parses ....................   Passed    0.02 sec
 2/3 Test  #2: full_disk ........................***Skipped   0.01 sec
 3/3 Test  #3: mpi_tests_np2 ....................   Passed   12.50 sec

100% tests passed, 0 tests failed out of 3

Total Test time (real) =  12.90 sec
LOG
check summary-oom 0 "world 1 oom: per-GPU batch 1536 (bf16): 1 back-off(s), 1536x1 -> 768x2 from step 1; finished: yes, 2950 img/s after it" -- \
  "$script" --summarize "$r2"
check summary-resume 0 "world 1 resume: checkpoint at step 100, killed, resumed from step 100: 16 tensors compared, 0 not bitwise equal (max |a-b| 0.0)" -- \
  "$script" --summarize "$r2"
check summary-photos 0 "world 1 photos: 1024 photos (0.181 Mpx on average)" -- "$script" --summarize "$r2"
check summary-pipeline 0 "world 1 pipeline: 2810 img/s from photos (bf16, per-GPU batch 256, 15 loader threads), data wait 1.2 %" -- \
  "$script" --summarize "$r2"
check summary-data-verb 0 "world 1 data-verb: 9450 img/s from the loader alone on 15 threads" -- "$script" --summarize "$r2"
check summary-gloo2 0 "world 1 gloo2: 2 ranks on cuda:0 over gloo, accuracy 97.50 %, 3100 samples/s" -- "$script" --summarize "$r2"
check summary-unit-tests 0 "world 1 unit-tests: 2 of 3 passed, 0 failed, 0 crashed, 1 skipped" -- "$script" --summarize "$r2"
check summary-levers 0 "world 1 levers: chose per-GPU 8 x 8 (plain) within 11800 MB (search.memory_fraction 0.1447); plain: largest predicted 8, measured 8; recompute: largest predicted 16, measured 16; recompute weighed: yes" -- \
  "$script" --summarize "$r2"
check summary-trace 0 "world 1 trace: 4210 GPU kernel events in steps [13, 14, 15], 0 NCCL kernel(s) (1 GPU: no NCCL kernel in the traced steps (nothing to reduce across one rank); 3 NCCL host-side event(s)); NVML at most: GPU 99 %, 45100 MB, 656 W" -- \
  "$script" --summarize "$r2"
check summary-optimizer-step 0 "world 1 optimizer-step: adamw (148 tensors, 124.4 M): per-tensor 1.01x, multi-tensor 2.5x, fused 5.0x torch::optim (4.1 ms); sgd (161 tensors, 25.6 M): per-tensor 0.99x, multi-tensor 2.5x, fused 4.0x torch::optim (2.0 ms); lars (161 tensors, 25.6 M): per-tensor 1.0x, multi-tensor 3.0x per-tensor (3.0 ms)" -- \
  "$script" --summarize "$r2"
check summary-single-gpu-passed 0 "gpu_acceptance: PASSED;" -- "$script" --summarize "$r2"
json2() {  # the summary's entry of STEP, one key a line
  python3 -c 'import json, sys
e = json.load(open(sys.argv[1]))["runs"][0][sys.argv[2]]
for k, v in e.items(): print(k, json.dumps(v))' "$r2/summary.json" "$1"
}
check summary-json-oom 0 "per_gpu_batch_end 768" -- json2 oom
check summary-json-oom-accum 0 "accum_steps_end 2" -- json2 oom
check summary-json-oom-finished 0 "finished true" -- json2 oom
check summary-json-oom-backoff 0 '"from": "1536x1", "to": "768x2", "peak_mb": 80100' -- json2 oom
check summary-json-resume 0 "tensors_not_bitwise_equal 0" -- json2 resume
check summary-json-resume-equal 0 "bitwise_equal true" -- json2 resume
check summary-json-resume-killed 0 "killed true" -- json2 resume
check summary-json-pipeline 0 "data_wait_fraction 0.012" -- json2 pipeline
check summary-json-pipeline-loader 0 "loader_images_per_s 9100.0" -- json2 pipeline
check summary-json-data-verb 0 "images_per_s 9450.5" -- json2 data-verb
check summary-json-data-verb-threads 0 "threads 15" -- json2 data-verb
check summary-json-gloo2 0 "world_size 2" -- json2 gloo2
check summary-json-unit-tests 0 "tests_total 3" -- json2 unit-tests
check summary-json-unit-tests-time 0 "ctest_seconds 12.9" -- json2 unit-tests
check summary-json-levers-weighed 0 "recompute_weighed true" -- json2 levers
check summary-json-levers-larger 0 "recompute_fits_larger true" -- json2 levers
check summary-json-levers-plain 0 "largest_plain_fit 8" -- json2 levers
check summary-json-levers-fraction 0 "memory_fraction 0.1447" -- json2 levers
check summary-json-trace-nvml 0 "nvml_nonzero true" -- json2 trace
check summary-json-optimizer 0 '"multi_tensor": {"ms": 1.64, "vs_baseline": 2.5}, "fused": {"ms": 0.82, "vs_baseline": 5.0}' -- json2 optimizer-step
check summary-json-optimizer-device 0 'device "cuda"' -- json2 optimizer-step
# Each step's way of failing.
steps2 0 1 0 0 0 2 8 0 1 2
for f in levers/search.json trace/trace_check.json optimizer-step/log; do cp "$r2/w1/$f" "$r2/w1/$f.good"; done
python3 - "$r2/w1/levers/search.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["levers"][1].update(fitted=False, timed=False, predicted_max_per_gpu=0, measured_max_per_gpu=0,
                      verdict="pruned: memory did not bound the walk")
j["candidates"] = j["candidates"][:1]
json.dump(j, open(sys.argv[1], "w"))
PY
python3 - "$r2/w1/trace/trace_check.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j.update(problems=["NVML metrics gpu_power_w zero"], nvml_nonzero=False)
json.dump(j, open(sys.argv[1], "w"))
PY
printf 'make: *** [bench/optimizer_step.cc] Error 1\n' >"$r2/w1/optimizer-step/log"
echo '{"per_gpu_batch": 768, "accum_steps": 1, "completed": true, "oom_backoffs": []}' >"$r2/w1/oom/report.json"
echo "model_diff: 16 tensors, 3 not bitwise equal, max |a-b| = 1.2e-07 (param fc1.weight), tolerance 0" \
  >"$r2/w1/resume/diff.txt"
echo "FAIL: the resumed model is not bitwise equal to the uninterrupted run's (model_diff exit 1)" >>"$r2/w1/resume/log"
rm "$r2/w1/gloo2/report.json"
echo "[rank 0/2 host vm] error: host vm runs 2 ranks but this rank sees only 1 GPU(s) (CUDA_VISIBLE_DEVICES='0'); start at most one rank per GPU (mpirun -np, or --map-by ppr:1:node across hosts) or set train.device: cpu" \
  >"$r2/w1/gloo2/log"
cat >"$r2/w1/unit-tests/log" <<'LOG'
 1/3 Test  #1: Cli.NoGpuIsBadInput ..............***Failed    0.31 sec
 2/3 Test  #2: mpi_tests_np2 ....................***Timeout 120.01 sec
 3/3 Test  #3: Checkpoint.Rotates ...............***Exception: SegFault  0.05 sec

0% tests passed, 3 tests failed out of 3
LOG
check summary-failures 1 "gpu_acceptance: FAILED: world 1 oom, world 1 resume, world 1 gloo2, world 1 unit-tests, world 1 levers, world 1 trace, world 1 optimizer-step" -- \
  "$script" --summarize "$r2"
check summary-levers-not-weighed 0 "recompute was not weighed (pruned: memory did not bound the walk): memory did not bound plain data parallel at search.memory_fraction 0.1447 (--lever-fraction sets it)" -- \
  json2 levers
check summary-trace-problem 1 "world 1 trace (FAILED): 4210 GPU kernel events" -- "$script" --summarize "$r2"
check summary-trace-problem-why 0 'problem "NVML metrics gpu_power_w zero"' -- json2 trace
check summary-optimizer-failed 1 "world 1 optimizer-step (FAILED): no figures" -- "$script" --summarize "$r2"
check summary-oom-no-backoff 0 "per-GPU batch 1536 did not run out of memory: no back-off to see" -- json2 oom
check summary-resume-unequal 0 "tensors_not_bitwise_equal 3" -- json2 resume
check summary-resume-why 0 "the resumed model is not bitwise equal" -- json2 resume
check summary-gloo2-refused 0 "batchdist refused 2 ranks on one GPU (worker/device.cc chooseDevice" -- json2 gloo2
check summary-gloo2-refused-line 1 "world 1 gloo2 (FAILED): batchdist refused 2 ranks on one GPU" -- "$script" --summarize "$r2"
check summary-unit-tests-failed 1 "world 1 unit-tests (FAILED): 0 of 3 passed, 3 failed, 1 crashed, 0 skipped (Cli.NoGpuIsBadInput (Failed), mpi_tests_np2 (Timeout), Checkpoint.Rotates (Exception: SegFault))" -- \
  "$script" --summarize "$r2"
# Stopped at the deadline: what the step left is still summarized.
steps2 0 0 0 124 0 0 124 0 0 0
for f in levers/search.json trace/trace_check.json optimizer-step/log; do mv "$r2/w1/$f.good" "$r2/w1/$f"; done
rm "$r2/w1/pipeline/report.json"
printf ' 1/9 Test  #1: Config.Parses ....................   Passed    0.02 sec\n' >"$r2/w1/unit-tests/log"
echo '{"per_gpu_batch": 768, "accum_steps": 2, "completed": true, "oom_backoffs": [{"step": 1, "from": "1536x1", "to": "768x2"}]}' \
  >"$r2/w1/oom/report.json"
echo "model_diff: 16 tensors, 0 not bitwise equal, max |a-b| = 0, tolerance 0" >"$r2/w1/resume/diff.txt"
sed -i '/^FAIL/d' "$r2/w1/resume/log"
echo '{"backend": "gloo", "device": "cuda:0", "world_size": 2, "eval_accuracy": 0.975, "samples_per_s": 3100}' \
  >"$r2/w1/gloo2/report.json"
: >"$r2/w1/gloo2/log"
check summary-deadline 1 "gpu_acceptance: FAILED: world 1 pipeline, world 1 unit-tests; " -- "$script" --summarize "$r2"
check summary-deadline-tests 1 "world 1 unit-tests (FAILED): 1 of 9 passed, 0 failed, 0 crashed, 0 skipped, 8 unfinished" -- "$script" --summarize "$r2"
check summary-deadline-why 0 "stopped at the time budget's deadline (--budget-s)" -- json2 pipeline

[ "$fails" = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all checks passed"

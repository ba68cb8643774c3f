#!/usr/bin/env bash
# The parts of bench/gpu_acceptance.sh that need no GPU: the script parses,
# (shellcheck where installed), argument errors exit 2, a machine without a GPU
# exits 3 with one message, and the GPU count (a fake nvidia-smi, narrowed by
# CUDA_VISIBLE_DEVICES and --gpus) gives the world sizes of the plan (--dry-run).
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
check gpus-three 0 "world 3: quickstart (nccl); resnet50-bf16 ddp-bf16;" -- \
  "${fake[@]}" "$script" --dry-run --gpus 3 --precisions bf16
check too-many 2 "--gpus 5, but only 4 GPU(s) are visible" -- "${fake[@]}" "$script" --dry-run --gpus 5
[ "$fails" = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all checks passed"

#!/usr/bin/env bash
# Benchmark, not a test: batchdist against PyTorch DDP (gloo) on the same CPU
# workloads, 2 ranks, same threads per rank, same mpirun, once per LibTorch:
#   1.13: batchdist of the Debian build vs DDP from Debian's python3-torch
#   2.x:  batchdist of the CUDA leg's build (running on the CPU) vs DDP from the
#         venv tests/cuda_leg.sh made (the same torch wheel it links)
# Workloads (WORKLOADS, default both):
#   mlp  MLP 256-512-512-10 on synthetic data, SGD with momentum, global batch 256;
#        samples/s
#   gpt  model.name: gpt (Note [gpt]) on byte-level tokens of the GPL-3 Debian ships
#        (batchdist_make_data tokens beside the 1.13 binary), AdamW, global batch 32
#        windows of GPT_SHAPE's seq_len, no validation set; DDP trains the same
#        network written in PyTorch (bench/gpt_model.py, nanoGPT's shape: the same
#        parameters, checked against batchdist's model.pt once per torch, the same
#        init, optimizer and mean token cross-entropy) on the same token file; tokens/s
# Each pair runs batchdist and DDP back to back, batchdist first in odd pairs and
# DDP first in even ones (a machine that slows or speeds up during a run favours
# neither side), pairs interleaved (mlp 1.13 A B, mlp 2.x B A, gpt 1.13 A B, ...);
# the ratio is per pair, the median over pairs.
#
# Both sides train WARMUP [5] + STEPS [120] steps and time the last STEPS alike:
# DDP from its own clock after the warm-up steps, batchdist from metrics.jsonl
# (rank 0's `seconds` since the run began, at its metrics points: the first point
# at or after step WARMUP to the last). The 1.13 leg's speed depends on the BLAS
# behind Debian's libblas.so.3; its name and the kernels OpenBLAS picked are printed.
#
#   [BACKEND=gloo|mpi] [WORKLOADS="mlp gpt"] [GPT_SHAPE="LAYERS HEADS EMBED SEQ_LEN"]
#   [STEPS=N] [WARMUP=N] bench/vs_ddp.sh [BATCHDIST_BIN] [PAIRS] [BATCHDIST_BIN_2X]
#     defaults: build/launcher/batchdist 5 build-cuda/launcher/batchdist; BACKEND
#     is batchdist's dist.backend [auto] (DDP always uses gloo: BACKEND=gloo
#     compares like with like); GPT_SHAPE ["2 2 64 64": configs/gpt-tiny.yaml's]
# A leg whose binary or torch is missing is reported as skipped, the gpt workload
# without a batchdist_make_data (tests/ beside launcher/ of either binary).
set -euo pipefail
bin=${1:-build/launcher/batchdist}
pairs=${2:-5}
bin2=${3:-build-cuda/launcher/batchdist}
here=$(cd "$(dirname "$0")" && pwd)
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
workloads=${WORKLOADS:-mlp gpt}
read -r gpt_layers gpt_heads gpt_embed gpt_seq <<<"${GPT_SHAPE:-2 2 64 64}"
steps=${STEPS:-120} warmup=${WARMUP:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Legs: name, batchdist binary, python with the matching torch.
names=() bins=() pys=()
add_leg() {
  local name=$1 b=$2 py=$3 why=""
  if [ ! -x "$b" ]; then
    why="no $b"
  elif ! "$py" -c 'import torch.distributed' 2>/dev/null; then
    why="no torch for $py"
  fi
  if [ -n "$why" ]; then
    echo "torch $name: skipped ($why)"
    return
  fi
  names+=("$name") bins+=("$b") pys+=("$py")
}
add_leg 1.13 "$bin" /usr/bin/python3
add_leg 2.x "$bin2" "$("$here/../tests/cuda_leg.sh" --venv-path)/bin/python"
[ ${#names[@]} -gt 0 ] || { echo "vs_ddp.sh: nothing to compare" >&2; exit 1; }

# Per workload: $out/W.yaml for batchdist, ddp_W (the function) for ddp_baseline.py's
# arguments, unit[W] the rate compared and per_sample[W] its count in a sample; the
# settings both sides share are written once, here.
declare -A unit per_sample
mlp_setup() {
  cat >"$out/mlp.yaml" <<YAML
model: {name: mlp, hidden: [512, 512], batchnorm: false}
data: {name: synthetic, samples: 8192, shape: [256], classes: 10, val_fraction: 0}
batch: {global: 256}
optim: {name: sgd, lr: 0.05, base_batch: 256, momentum: 0.9}
train: {epochs: 100000, max_steps: $((warmup + steps)), check_finite: false, device: cpu}
YAML
  unit[mlp]=samples per_sample[mlp]=1
}
ddp_mlp() { ddp_args=(--model mlp); }
gpt_setup() {
  local make_data
  for make_data in "${MAKE_DATA:-}" "$(dirname "$bin")/../tests/batchdist_make_data" \
                   "$(dirname "$bin2")/../tests/batchdist_make_data" ""; do
    [ -z "$make_data" ] || [ ! -x "$make_data" ] || break
  done
  if [ -z "$make_data" ]; then
    echo "workload gpt: skipped (no batchdist_make_data beside $bin or $bin2; or set MAKE_DATA)"
    return 1
  fi
  "$make_data" tokens --text /usr/share/common-licenses/GPL-3 --out "$out/tokens" >/dev/null ||
    { echo "workload gpt: skipped ($make_data tokens failed)"; return 1; }
  gpt_shape=(--layers "$gpt_layers" --heads "$gpt_heads" --embed "$gpt_embed" --vocab 256 --seq-len "$gpt_seq")
  gpt_optim=(--global-batch 32 --lr 0.001 --beta1 0.9 --beta2 0.99 --eps 1e-8 --weight-decay 0.01)
  cat >"$out/gpt.yaml" <<YAML
model: {name: gpt, layers: $gpt_layers, heads: $gpt_heads, embed: $gpt_embed, vocab: 256, seq_len: $gpt_seq, dropout: 0}
data: {name: tokens, path: $out/tokens/train.bin, val_fraction: 0}
batch: {global: 32, last_batch: drop}
optim: {name: adamw, lr: 0.001, base_batch: 32, lr_scaling: none, beta1: 0.9, beta2: 0.99, eps: 1e-8,
        weight_decay: 0.01, schedule: constant}
train: {epochs: 100000, max_steps: $((warmup + steps)), check_finite: false, device: cpu}
YAML
  unit[gpt]=tokens per_sample[gpt]=$gpt_seq
  echo "workload gpt: layers $gpt_layers, heads $gpt_heads, embed $gpt_embed, seq_len $gpt_seq," \
       "global batch 32 windows ($((32 * gpt_seq)) tokens) a step, tokens of /usr/share/common-licenses/GPL-3"
}
ddp_gpt() { ddp_args=(--model gpt --tokens "$out/tokens/train.bin" "${gpt_shape[@]}" "${gpt_optim[@]}"); }
active=()
for w in $workloads; do
  case $w in
    mlp|gpt) if "${w}_setup"; then active+=("$w"); fi ;;
    *) echo "vs_ddp.sh: unknown workload '$w' (WORKLOADS: mlp, gpt)" >&2; exit 2 ;;
  esac
done
[ ${#active[@]} -gt 0 ] || { echo "vs_ddp.sh: no workload to run" >&2; exit 1; }

blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo none)
kernels=$(python3 -c 'import ctypes, sys
f = ctypes.CDLL(sys.argv[1]).openblas_get_corename; f.restype = ctypes.c_char_p; print(f().decode())' "$blas" 2>/dev/null ||
          echo "not OpenBLAS")
echo "libblas.so.3 of the 1.13 leg: $blas (kernels: $kernels${OPENBLAS_CORETYPE:+, OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE})"
declare -A ratios checked
# MASTER_PORT: one the kernel has free now, not a fixed 29500 (PyTorch's default,
# which another job on this machine, or a second copy of this script, may hold).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# batchdist W K: its rate (unit[W]/s) over the steps after the warm-up, from metrics.jsonl.
batchdist() {
  local w=$1 k=$2
  rm -rf "$out/run"
  mpirun "${flags[@]}" -np 2 "${bins[$k]}" "$out/$w.yaml" -q --output "$out/run" \
    --set dist.backend="${BACKEND:-auto}" >&2
  python3 - "$out/run/metrics.jsonl" "$warmup" "${per_sample[$w]}" <<'PY'
import json, sys
points = [json.loads(l) for l in open(sys.argv[1])]
points = [p for p in points if p["kind"] == "step"]
first = next(p for p in points if p["step"] >= int(sys.argv[2]))
last = points[-1]
samples = (last["step"] - first["step"]) * last["global_batch"]  # fixed global batch
print(f"{samples * int(sys.argv[3]) / (last['seconds'] - first['seconds']):.1f}")
PY
}
# ddp W K: PyTorch DDP's rate over the same steps.
ddp() {
  local w=$1 k=$2
  "ddp_$w"
  mpirun "${flags[@]}" -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$(free_port)" \
    "${pys[$k]}" -W ignore "$here/ddp_baseline.py" "${ddp_args[@]}" --steps "$steps" --warmup "$warmup" |
    awk -v u="${unit[$w]}_per_s" '$1 == u {print $2}'
}
# pair I W K: batchdist and DDP on workload W with torch leg K (Note above: the
# order alternates); appends the ratio.
pair() {
  local i=$1 w=$2 k=$3 a b r u=${unit[$2]}
  if [ $((i % 2)) = 1 ]; then
    a=$(batchdist "$w" "$k"); b=$(ddp "$w" "$k")
  else
    b=$(ddp "$w" "$k"); a=$(batchdist "$w" "$k")
  fi
  if [ "$w" = gpt ] && [ -z "${checked[$k]:-}" ]; then  # once per torch: the same network?
    checked[$k]=1
    "${pys[$k]}" -W ignore "$here/gpt_model.py" --check "$out/run/model.pt" "${gpt_shape[@]}"
  fi
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')
  ratios[$w/$k]+="$r "
  echo "pair $i, $w, torch ${names[$k]}: batchdist $a $u/s, PyTorch DDP $b $u/s, ratio $r"
}
for i in $(seq 1 "$pairs"); do
  for w in "${active[@]}"; do
    for k in "${!names[@]}"; do pair "$i" "$w" "$k"; done
  done
done
for w in "${active[@]}"; do
  for k in "${!names[@]}"; do
    tr ' ' '\n' <<<"${ratios[$w/$k]}" | grep . | sort -n |
      awk -v name="${names[$k]}" -v w="$w" -v u="${unit[$w]}" '{v[NR]=$1} END {
      m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2;
      printf "%s, torch %s: batchdist / PyTorch DDP %s/s: median %.3f (min %.3f, max %.3f, %d pairs)\n", w, name, u, m, v[1], v[NR], NR}'
  done
done

#!/usr/bin/env bash
# TensorBoard's PyTorch profiler plugin (torch-tb-profiler, in the venv of
# tests/tensorboard_venv.sh) reading a real run's traces (Note [step profiler]):
# a 2-rank quickstart over Gloo with `profile` wait 2 warmup 1 active 3, then
# `tensorboard --logdir OUT/run` on a free port of 127.0.0.1. Checked through the
# plugin's data API: the run "profile" with one worker per rank, the Overview,
# Operator, Trace and Distributed views, the Overview's steps 4, 5 and 6 for each worker, and
# no "Error in input data" in TensorBoard's log (what it says of ranges that do
# not nest). TensorBoard is killed on exit.
#   profile_tensorboard.sh MPIRUN "MPI_FLAGS" BIN SRC_DIR OUT
set -uo pipefail
MPIRUN=$1 MPI_FLAGS=$2 BIN=$3 SRC=$4 OUT=$5

fail() { echo "FAIL: $*" >&2; exit 1; }
. "$SRC/tests/tensorboard_lib.sh"
rm -rf "$OUT" && mkdir -p "$OUT" || fail "cannot create $OUT"
venv=$(bash "$SRC/tests/tensorboard_venv.sh") || fail "no TensorBoard venv (see above)"

# shellcheck disable=SC2086
$MPIRUN $MPI_FLAGS -np 2 "$BIN" "$SRC/configs/quickstart.yaml" --output "$OUT/run" --set train.threads=1 \
  --set batch.per_gpu=16 --set train.max_steps=9 --set dist.backend=gloo --set dist.bucket_mb=0.02 \
  --set profile.wait=2 --set profile.warmup=1 --set profile.active=3 --set report.tensorboard=false \
  --quiet >"$OUT/run.log" 2>&1 || { cat "$OUT/run.log"; fail "the run failed"; }

start_tensorboard "$venv" "$OUT/run" "$OUT/tensorboard.log"

"$venv/bin/python" - "$url" <<'PY' || { tail -n 20 "$OUT/tensorboard.log"; fail "the profiler plugin's data API (above)"; }
import json, sys, time, urllib.parse, urllib.request
url = sys.argv[1] + "/data/plugin/pytorch_profiler/"
def get(path, **q):
    with urllib.request.urlopen(url + path + "?" + urllib.parse.urlencode(q), timeout=30) as r:
        return json.load(r)
deadline, runs = time.time() + 120, {}
while time.time() < deadline:  # bounded: the plugin loads runs in the background
    try:
        runs = get("runs")
        if runs.get("runs") and not runs.get("loading"):
            break
    except OSError:
        pass
    time.sleep(0.5)
assert runs.get("runs") == ["profile"], f"runs: {runs}"
views = get("views", run="profile")
# "Distributed": the plugin's view of the ranks together, offered because every
# trace carries distributedInfo.
assert views == ["Overview", "Operator", "Trace", "Distributed"], f"views: {views}"
workers = get("workers", run="profile", view="Overview")
assert len(workers) == 2 and [w[-6:] for w in sorted(workers)] == ["_rank0", "_rank1"], f"workers: {workers}"
for w in sorted(workers):
    spans = get("spans", run="profile", worker=w)
    steps = [row[0] for row in get("overview", run="profile", worker=w, span=spans[0])["steps"]["rows"]]
    assert steps == ["4", "5", "6"], f"{w}: overview steps {steps}"
    print(f"ok: {w}: the plugin's overview splits steps {steps}")
PY
if grep -q "Error in input data" "$OUT/tensorboard.log"; then
  grep "Error in input data" "$OUT/tensorboard.log" | head -3
  fail "the plugin found ranges that do not nest (above)"
fi
echo "ok: TensorBoard's PyTorch profiler plugin reads both ranks' traces without an input error"

#!/usr/bin/env bash
# Makes (or reuses) the virtual environment with TensorBoard that the TensorBoard
# tests read and serve event files with, and its PyTorch profiler plugin that
# tests/profile_tensorboard.sh serves traces with; prints its path. Pinned here only.
# It lives outside the clone, in ${BATCHDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchdist},
# like tests/cuda_leg.sh's venv: a second run installs nothing. Concurrent tests
# (ctest -j2) take a lock, so one of them builds it and the other waits.
# Exits 1 naming the cause when it cannot be made (no python3-venv, no PyPI).
set -uo pipefail
TENSORBOARD_VERSION=2.21.0
PROFILER_PLUGIN_VERSION=0.4.3

python=${BATCHDIST_PYTHON:-python3}
cache=${BATCHDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchdist}
venv="$cache/tensorboard-venv"
die() { echo "tensorboard_venv: error: $*" >&2; exit 1; }
command -v "$python" >/dev/null || die "no $python; apt-get install python3 python3-venv"
mkdir -p "$cache" || die "cannot create $cache"
exec 9>"$cache/tensorboard-venv.lock" || die "cannot write $cache/tensorboard-venv.lock"
flock -w 600 9 || die "waited 600 s for $cache/tensorboard-venv.lock"

ready() {
  [ -x "$venv/bin/tensorboard" ] &&
    [ "$("$venv/bin/python" -c 'import tensorboard; print(tensorboard.__version__)' 2>/dev/null)" \
      = "$TENSORBOARD_VERSION" ] &&
    [ "$("$venv/bin/python" -c 'import torch_tb_profiler; print(torch_tb_profiler.__version__)' 2>/dev/null)" \
      = "$PROFILER_PLUGIN_VERSION" ]
}
if ! ready; then
  rm -rf "$venv"
  "$python" -m venv "$venv" >&2 || die "python3 -m venv failed; apt-get install python3-venv"
  "$venv/bin/pip" install -q --progress-bar off "tensorboard==$TENSORBOARD_VERSION" \
    "torch-tb-profiler==$PROFILER_PLUGIN_VERSION" >&2 \
    || die "pip install tensorboard==$TENSORBOARD_VERSION torch-tb-profiler==$PROFILER_PLUGIN_VERSION failed (is PyPI reachable?)"
  ready || die "$venv has no working tensorboard $TENSORBOARD_VERSION with torch-tb-profiler $PROFILER_PLUGIN_VERSION after pip install"
fi
echo "$venv"

#!/usr/bin/env bash
# The CUDA leg of CI: batchdist built against LibTorch 2.x with CUDA and NCCL (the
# pip `torch` wheel), next to the Debian 1.13 build of the README's test command.
# Needs no GPU: a CUDA build runs on the CPU, and the tests it runs (ctest label
# `cuda_leg`: unit, command-line, 2- and 3-rank mpirun, NCCL link check) do too.
#
#   tests/cuda_leg.sh [--build-dir DIR] [--jobs N] [--no-tests] [--torch VERSION|newest]
#   tests/cuda_leg.sh --venv          make (or reuse) the venv, print its path, nothing else
#   tests/cuda_leg.sh --venv-path     print where the venv is (or would be); changes nothing
#
# 1. venv: a virtual environment with torch==$TORCH_VERSION (pinned here and only
#    here, so CI is reproducible) from PyPI, its wheels kept in a wheelhouse; both
#    live outside the clone, in ${BATCHDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchdist},
#    so a second run downloads and installs nothing. `--torch newest` takes the
#    newest torch on PyPI instead (what a user who pip-installs torch today gets),
#    `--torch X.Y.Z` that release; the build directory then defaults to
#    build-cuda-torchX.Y.Z, beside the pinned leg's.
# 2. CUDA: the toolkit in $CUDA_HOME (default /usr/local/cuda) when it has nvcc and
#    the CUDA major.minor the wheel was built with. Otherwise the same toolkit from
#    NVIDIA's pip wheels (nvcc, crt, nvvm, cccl of that major.minor; the runtime
#    and headers come with torch), laid out as a toolkit directory in the venv:
#    torch's CMake config runs enable_language(CUDA) and the old FindCUDA, which
#    need bin/nvcc and unversioned lib*.so names the wheels do not have.
# 3. NCCL: configured with no -DNCCL_ROOT, as a user would; configure must take the
#    nvidia-nccl wheel's, the library libtorch_cuda.so loads at run time, so the
#    header batchdist compiles against is the one it runs with (the script checks).
#    -DBATCHDIST_REQUIRE_NCCL=ON: configure fails if the NCCL backend would be left out.
# 4. Build every target, check that the binary constructs c10d::ProcessGroupNCCL, and
#    run `ctest -L cuda_leg`. Prints the time of each phase.
#
# Environment: BATCHDIST_CACHE, BATCHDIST_PYTHON [python3], CUDA_HOME
# [/usr/local/cuda], BATCHDIST_JOBS [the cores: compile jobs], BATCHDIST_TEST_JOBS [4:
# ctest jobs; as in the README, its tests mostly wait on processes]. Talks only to PyPI (pip).
set -euo pipefail
shopt -s nullglob

TORCH_VERSION=2.14.1  # the one pin: CUDA 13.0 build of LibTorch 2.14 (C++20, NCCL 2.30)

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
build=""
torch_arg=""
jobs=${BATCHDIST_JOBS:-$(nproc)}
test_jobs=${BATCHDIST_TEST_JOBS:-4}
run_tests=1
venv_only=0
path_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-tests) run_tests=0; shift ;;
    --torch) torch_arg=${2:-}; shift 2 ;;
    --venv) venv_only=1; shift ;;
    --venv-path) path_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cuda_leg.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "cuda_leg: $*" >&2; }
die() { echo "cuda_leg: error: $*" >&2; exit 1; }
now() { date +%s; }
times=()
phase_done() { times+=("$1 $(( $(now) - $2 )) s${3:+ ($3)}"); log "$1: $(( $(now) - $2 )) s${3:+ ($3)}"; }

python=${BATCHDIST_PYTHON:-python3}
command -v "$python" >/dev/null || die "no $python; apt-get install python3 python3-venv"
# --torch: the pin unless asked; 'newest' is resolved on PyPI now, so the venv and
# build directory name the release actually taken.
case $torch_arg in
  "") ;;
  newest)
    TORCH_VERSION=$("$python" -m pip index versions torch 2>/dev/null | sed -n 's/^torch (\([^)]*\)).*/\1/p')
    [ -n "$TORCH_VERSION" ] || die "--torch newest: 'pip index versions torch' named no release (is PyPI reachable?)"
    log "--torch newest: torch $TORCH_VERSION" ;;
  [0-9]*.[0-9]*) TORCH_VERSION=$torch_arg ;;
  *) echo "cuda_leg.sh: --torch takes a release (2.15.0) or 'newest', not '$torch_arg'" >&2; exit 2 ;;
esac
if [ -z "$build" ]; then
  build="$src/build-cuda"
  [ -z "$torch_arg" ] || build="$src/build-cuda-torch$TORCH_VERSION"
fi
case $build in /*) ;; *) build="$PWD/$build" ;; esac
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
cache=${BATCHDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchdist}
wheels="$cache/wheels"
venv="$cache/venv-torch$TORCH_VERSION-py$pyver"
if [ "$path_only" = 1 ]; then echo "$venv"; exit 0; fi
mkdir -p "$wheels"

# pip: from the wheelhouse alone when it has everything, else from PyPI into the
# wheelhouse (pip skips wheels already there) and then from the wheelhouse.
pip_install() {
  local offline=(--no-index --find-links "$wheels" --progress-bar off)
  "$venv/bin/pip" install -q "${offline[@]}" "$@" >/dev/null 2>&1 && return 0
  "$venv/bin/pip" download --no-cache-dir --progress-bar off --dest "$wheels" "$@" >&2
  "$venv/bin/pip" install "${offline[@]}" "$@" >&2
}

# --- 1. venv with torch -------------------------------------------------------
t=$(now)
# Two legs of one torch at once (two clones, two CI runs) share the venv, its
# cuda-toolkit layout and the wheelhouse: one makes them while the other waits.
exec 9>"$cache/venv-torch$TORCH_VERSION.lock"
flock 9
if [ -f "$venv/.batchdist-torch-ok" ]; then
  phase_done venv "$t" "cached: $venv"
else
  rm -rf "$venv"
  "$python" -m venv "$venv" ||
    die "'$python -m venv' failed; on Debian: apt-get install python3-venv"
  before=$(du -sm "$wheels" | cut -f1)
  pip_install "torch==$TORCH_VERSION"
  touch "$venv/.batchdist-torch-ok"
  phase_done venv "$t" "created; wheelhouse $before -> $(du -sm "$wheels" | cut -f1) MB, venv $(du -sm "$venv" | cut -f1) MB"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# torch warns on import without numpy; the facts below are what matter.
read -r torch_cuda cxx11 torch_cmake < <("$venv/bin/python" -W ignore -c '
import torch
print(torch.version.cuda, int(torch.compiled_with_cxx11_abi()), torch.utils.cmake_prefix_path)' 2>/dev/null)
[ -n "${torch_cuda:-}" ] || die "torch==$TORCH_VERSION in $venv does not import; remove $venv and run again"
[ "$torch_cuda" != None ] || die "torch==$TORCH_VERSION in $venv has no CUDA"
# yaml-cpp, Boost and Open MPI come from Debian, built with the C++11 ABI.
[ "$cxx11" = 1 ] || die "torch==$TORCH_VERSION uses the pre-C++11 ABI; Debian's yaml-cpp/Boost would not link"
if [ "$venv_only" = 1 ]; then echo "$venv"; exit 0; fi

# --- 2. CUDA toolkit --------------------------------------------------------------
t=$(now)
cuda_home=${CUDA_HOME:-/usr/local/cuda}
cuda=""
if [ -x "$cuda_home/bin/nvcc" ]; then
  have=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
  if [ "$have" = "$torch_cuda" ]; then
    cuda=$cuda_home
    cuda_from="toolkit $cuda_home (CUDA $have)"
  else
    # libtorch_cuda.so was built for $torch_cuda; batchdist would link the toolkit's
    # libcudart/libnvrtc of another minor version and load both at run time.
    log "$cuda_home has CUDA $have, torch==$TORCH_VERSION was built with $torch_cuda: using NVIDIA's pip wheels"
  fi
fi
if [ -z "$cuda" ]; then
  major=${torch_cuda%%.*}
  [ "$major" -ge 13 ] || die "the pip toolkit layout handled here is CUDA >= 13's (nvidia/cu13); torch has CUDA $torch_cuda"
  nv="$site/nvidia/cu$major"
  if [ ! -f "$venv/.batchdist-cuda-wheels-ok" ]; then
    # All four of the wheel's CUDA major.minor: nvidia-cuda-nvcc leaves nvvm and crt
    # unpinned, and a newer cicc writes PTX this ptxas rejects ("Unsupported .version").
    pip_install "nvidia-cuda-nvcc==$torch_cuda.*" "nvidia-cuda-crt==$torch_cuda.*" \
      "nvidia-nvvm==$torch_cuda.*" "nvidia-cuda-cccl==$torch_cuda.*"
    touch "$venv/.batchdist-cuda-wheels-ok"
  fi
  cuda="$venv/cuda-toolkit"
  rm -rf "$cuda"
  mkdir -p "$cuda/bin" "$cuda/lib64"
  # bin/ holds links to the files, not a link to the directory: nvcc finds the
  # rest as bin/../{include,nvvm,lib64}, and `..` of a linked directory is the
  # wheel's, which has no lib64.
  for f in "$nv"/bin/*; do ln -s "$f" "$cuda/bin/"; done
  for d in include nvvm; do ln -s "$nv/$d" "$cuda/$d"; done
  for f in "$nv"/lib/*.so.* "$nv"/lib/*.a; do
    name=${f##*/}
    ln -sf "$f" "$cuda/lib64/$name"
    case $name in *.so.*) ln -sf "$name" "$cuda/lib64/${name%%.so.*}.so" ;; esac
  done
  ln -s lib64 "$cuda/lib"
  cuda_from="NVIDIA pip wheels, as $cuda (CUDA $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p'))"
fi
[ -f "$site/nvidia/nccl/include/nccl.h" ] ||
  die "no nccl.h in the nvidia-nccl wheel ($site/nvidia/nccl): torch==$TORCH_VERSION loads that NCCL, and batchdist compiles against its header"
nccl="$site/nvidia/nccl"
phase_done cuda "$t" "$cuda_from; NCCL from $nccl"
flock -u 9

# --- 3. configure -----------------------------------------------------------------
t=$(now)
# TORCH_CUDA_ARCH_LIST: batchdist has no CUDA kernels; naming one architecture
# skips torch's GPU probe. Torch's config also warns that it ignores
# CMAKE_CUDA_ARCHITECTURES (set by enable_language(CUDA)) and that kineto is
# not found (it is linked into libtorch_cpu.so): both harmless.
mkdir -p "$build"
# A build directory configured against another torch, toolkit or NCCL (say, before
# the pin moved) keeps their paths in its cache: start that cache afresh.
# Ninja where it is installed (the README's commands install it): it compiles a
# target's sources while the libraries before it still link (Note [unity build]).
generator="Unix Makefiles"
command -v ninja >/dev/null && generator=Ninja
inputs="torch=$torch_cmake cuda=$cuda nccl=$nccl generator=$generator"
if [ -f "$build/CMakeCache.txt" ] && [ "$(cat "$build/cuda_leg.inputs" 2>/dev/null)" != "$inputs" ]; then
  log "$build was configured with other inputs; configuring it afresh"
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
PATH="$cuda/bin:$PATH" CUDACXX="$cuda/bin/nvcc" CUDA_HOME="$cuda" \
  cmake -S "$src" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_cmake" \
    -DCUDAToolkit_ROOT="$cuda" -DCUDA_TOOLKIT_ROOT_DIR="$cuda" -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" \
    -DTORCH_CUDA_ARCH_LIST=9.0 \
    -DBATCHDIST_REQUIRE_NCCL=ON >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; die "configure failed (log above, $build/configure.log)"; }
grep -E '^-- batchdist:' "$build/configure.log" >&2
grep -q 'NCCL backend ON' "$build/configure.log" || die "configure did not report the NCCL backend ON"
# No -DNCCL_ROOT above, as a user would build: configure must take the wheel's NCCL by
# itself (Note [one NCCL]), even with a toolkit's NCCL on the system paths.
nccl_line=$(grep 'NCCL backend ON' "$build/configure.log")
grep -qF "($nccl/lib/" <<<"$nccl_line" ||
  die "configure took another NCCL than the wheel's ($nccl): $nccl_line"
echo "$inputs" >"$build/cuda_leg.inputs"
phase_done configure "$t"

# --- 4. build, link check, tests ------------------------------------------------
t=$(now)
cmake --build "$build" -j"$jobs"
phase_done build "$t" "-j$jobs"

"$build/launcher/batchdist" --version >&2
# The binary must construct c10d::ProcessGroupNCCL (the constructor, resolved from
# libtorch_cuda.so at load time), not just mention its options.
nccl_symbols=$(nm -C "$build/launcher/batchdist" | grep 'ProcessGroupNCCL' || true)
grep -q 'c10d::ProcessGroupNCCL::ProcessGroupNCCL(' <<<"$nccl_symbols" ||
  die "$build/launcher/batchdist does not call c10d::ProcessGroupNCCL's constructor: the NCCL backend is not linked"
log "nm -C $build/launcher/batchdist | grep ProcessGroupNCCL: $(wc -l <<<"$nccl_symbols") symbols, among them:"
grep 'c10d::ProcessGroupNCCL::ProcessGroupNCCL(\|typeinfo for c10d::ProcessGroupNCCL$' <<<"$nccl_symbols" >&2

if [ "$run_tests" = 1 ]; then
  t=$(now)
  ctest --test-dir "$build" -L cuda_leg -j"$test_jobs" --output-on-failure --no-tests=error
  phase_done tests "$t" "ctest -L cuda_leg -j$test_jobs"
fi
summary=$(printf '%s; ' "${times[@]}")
log "torch $TORCH_VERSION (CUDA $torch_cuda) leg passed; ${summary%; }"

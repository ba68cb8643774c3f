#!/usr/bin/env bash
# collective/torch_cuda.cmake on a fake pip layout (no CUDA, no torch needed):
#  - batchdist_torch_nccl names the libnccl.so.2 that libtorch_cuda.so loads by its
#    RUNPATH (site-packages/nvidia/nccl/lib), not a decoy on LD_LIBRARY_PATH nor the
#    system's (Note [one NCCL]);
#  - batchdist_check_torch_cuda stops configure, saying what to install, when the
#    toolkit's CUDA major.minor is not the wheel's, and passes when it is.
#   tests/torch_cuda_cmake_test.sh SOURCE_DIR
set -euo pipefail
src=${1:?usage: torch_cuda_cmake_test.sh SOURCE_DIR}
cc=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/batchdist_torch_cuda_cmake.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

site=$tmp/site-packages
mkdir -p "$site/nvidia/nccl/lib" "$site/nvidia/nccl/include" "$site/torch/lib" "$tmp/decoy"
echo 'int ncclCommSuspend(void) { return 0; }' >"$tmp/nccl.c"
"$cc" -shared -fPIC -Wl,-soname,libnccl.so.2 -o "$site/nvidia/nccl/lib/libnccl.so.2" "$tmp/nccl.c"
"$cc" -shared -fPIC -Wl,-soname,libnccl.so.2 -o "$tmp/decoy/libnccl.so.2" "$tmp/nccl.c"
echo '#define NCCL_MAJOR 2' >"$site/nvidia/nccl/include/nccl.h"
echo 'int ncclCommSuspend(void); int torch_cuda(void) { return ncclCommSuspend(); }' >"$tmp/torch_cuda.c"
# RUNPATH as the wheel has it ($ORIGIN-relative, --enable-new-dtags).
"$cc" -shared -fPIC -o "$site/torch/lib/libtorch_cuda.so" "$tmp/torch_cuda.c" \
  -L"$site/nvidia/nccl/lib" -l:libnccl.so.2 -Wl,--enable-new-dtags,-rpath,'$ORIGIN/../../nvidia/nccl/lib'
cat >"$site/torch/version.py" <<'PY'
__version__ = '2.99.0+cu132'
cuda: Optional[str] = '13.2'
PY

# Runs a cmake -P script that includes the module with TORCH_INSTALL_PREFIX set.
run_module() {
  { echo "set(TORCH_INSTALL_PREFIX \"$site/torch\")"
    echo "set(BATCHDIST_TORCH_LIBDIR \"$site/torch/lib\")"
    echo "set(Torch_VERSION 2.99.0)"
    echo "include(\"$src/collective/torch_cuda.cmake\")"
    cat; } >"$tmp/script.cmake"
  # The decoy first on LD_LIBRARY_PATH: the module must ask for the wheel's own choice.
  LD_LIBRARY_PATH="$tmp/decoy" cmake -P "$tmp/script.cmake"
}

out=$(run_module <<'CM' 2>&1
batchdist_torch_nccl(lib)
message("nccl=[${lib}]")
batchdist_torch_cuda_version(v)
message("cuda=[${v}]")
CM
) || fail "the module's functions failed: $out"
want=$(cd "$site/nvidia/nccl/lib" && pwd)/libnccl.so.2
grep -qF "nccl=[$want]" <<<"$out" || fail "batchdist_torch_nccl: want [$want]; got: $out"
grep -qF "cuda=[13.2]" <<<"$out" || fail "batchdist_torch_cuda_version: want [13.2]; got: $out"
echo "ok: libtorch_cuda.so's NCCL: $want (decoy on LD_LIBRARY_PATH ignored); torch CUDA 13.2"

if out=$(run_module <<'CM' 2>&1
batchdist_check_torch_cuda("13.0.88" "/usr/local/cuda/bin")
CM
); then fail "toolkit 13.0.88 under a CUDA 13.2 torch configured: $out"; fi
out=$(tr -s ' \n' '  ' <<<"$out")  # CMake wraps its messages
for want in "was built with CUDA 13.2" "the CUDA toolkit found is 13.0.88 (/usr/local/cuda/bin)" \
            "tests/cuda_leg.sh --torch 2.99.0" "nvidia-cuda-nvcc==13.2.*" "-DBATCHDIST_ALLOW_CUDA_MISMATCH=ON"; do
  grep -qF -- "$want" <<<"$out" || fail "the mismatch message lacks '$want': $out"
done
echo "ok: 13.0 toolkit refused: $(grep -m1 -o 'batchdist: Torch.*it\.' <<<"$out" || true)"
out=$(run_module <<'CM' 2>&1
batchdist_check_torch_cuda("13.2.51" "/opt/cuda-13.2/bin")
message("matched")
CM
) || fail "toolkit 13.2.51 under a CUDA 13.2 torch refused: $out"
grep -q matched <<<"$out" || fail "no 'matched': $out"
echo "ok: 13.2 toolkit accepted"
# A torch without version.py (Debian's, a LibTorch zip): nothing to compare.
rm "$site/torch/version.py"
out=$(run_module <<'CM' 2>&1
batchdist_check_torch_cuda("12.4.1" "/usr/local/cuda/bin")
message("unchecked")
CM
) || fail "a torch without version.py refused a toolkit: $out"
echo "ok: a torch without version.py is not checked"

#!/usr/bin/env bash
# bench/device_kit.sh without a GPU or network: the kit's package list (from apt's
# lists, as `pack` computes it) has what the build and mpirun need and none of the
# toolchains it prunes, and every shared library BINARY loads (its NEEDED entries
# and theirs, torch's and CUDA's own aside) is in a package of that list or of the
# base image's: a library batchdist gains that the kit does not pack fails here,
# not on an air-gapped GPU node. A binary that needs other libraries (cmake's
# libcurl) must fail the same check.
#   tests/device_kit_test.sh bench/device_kit.sh BINARY
set -uo pipefail
kit=$1
bin=$2
fails=0
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

here=$(cd "$(dirname "$0")" && pwd)
# (shellcheck: the shell_scripts_lint test)
for s in "$kit" "$here/../bench/device_kit_rehearsal.sh"; do
  bash -n "$s" || { echo "FAIL: bash -n $s"; exit 1; }
done

# apt's lists are what the list is computed from; without them this test cannot
# say anything, and says so (exit 1) rather than passing.
packages=$("$kit" packages) || { echo "FAIL: bench/device_kit.sh packages (above)"; exit 1; }
echo "the kit: $(wc -l <<<"$packages") packages"
for p in libopenmpi3 openmpi-bin libopenmpi-dev libgloo-dev libyaml-cpp-dev libboost1.74-dev \
         nlohmann-json3-dev libjpeg62-turbo-dev libpng-dev libopencv-imgproc-dev libprotobuf-dev \
         protobuf-compiler libprotoc32 libgtest-dev libblas3 liblapack3; do
  grep -qx "$p" <<<"$packages" || { echo "FAIL packages: no $p"; fails=$((fails + 1)); }
done
pruned=$(grep -E '^(libllvm|libclang|flang|gfortran|libicu|libgl1-mesa|libtorch|g\+\+|gcc|libc6$|libstdc\+\+6|zlib1g$)' <<<"$packages")
[ -z "$pruned" ] || { echo "FAIL packages: has what the kit prunes or the base image has: $(xargs <<<"$pruned")"; fails=$((fails + 1)); }
both=$(comm -12 <(sort <<<"$packages") <("$kit" base | sort))
[ -z "$both" ] || { echo "FAIL packages: in both the kit and the base list: $(xargs <<<"$both")"; fails=$((fails + 1)); }
echo "ok   packages"

check closure 0 "0 missing" -- "$kit" closure "$bin"
check closure-mpirun 0 "0 missing" -- "$kit" closure "$(readlink -f "$(command -v mpirun)")"
check closure-gains-a-library 1 "libcurl.so.4 (needed by cmake): " -- "$kit" closure "$(readlink -f "$(command -v cmake)")"
check unknown-command 2 "unknown command 'frobnicate'" -- "$kit" frobnicate
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/kit"
check build-without-debs 1 "no .deb files in $tmp/kit/debs" -- "$kit" build "$tmp/kit"
# run: a build that fails still leaves a summary naming it (and the build's log).
check run-build-fails 1 "build failed; $tmp/out/build.log" -- "$kit" run "$tmp/kit" "$tmp/out"
check run-build-fails-summary 0 '"failed_steps": ["build"]' -- cat "$tmp/out/summary.json"

[ "$fails" = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all checks passed"

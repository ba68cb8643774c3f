#!/usr/bin/env bash
# Note [libstdc++ first] (launcher/torch_libraries.cmake): batchdist's binaries call
# the system's libstdc++, never the private copy of std::filesystem a pip LibTorch's
# libtorch_cpu.so exports.
# 1. The link: each binary's first needed library is libstdc++.so.6, and running a
#    command that uses std::filesystem under LD_DEBUG=bindings, every symbol
#    libstdc++.so.6 defines that the binary looked up was bound to libstdc++.so.6.
#    On the CUDA leg (torch 2.14.1's wheel exports 101 std::filesystem symbols) this
#    fails without the link option.
# 2. The guard (common/stdlib_guard.h), for a link that did not keep that order: the
#    order forced wrong by preloading the LibTorch library that exports
#    std::filesystem. With BATCHDIST_STDLIB_GUARD=off the unit test StdlibGuard.*
#    must fail (the control: it sees the fault); with the guard, the program starts
#    again with libstdc++.so.6 preloaded and the test passes, and `batchdist plan`
#    restarts once and succeeds. Debian's LibTorch exports none: there part 2 does
#    not apply, and the test says so.
#   tests/stdlib_binding_test.sh BATCHDIST CONFIG UNIT_TESTS
set -uo pipefail
bin=$(readlink -f "$1") config=$(readlink -f "$2") unit=$(readlink -f "$3")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

stdlib=$(ldd "$bin" | awk '$1 == "libstdc++.so.6" {print $3}')
[ -n "$stdlib" ] || { echo "FAIL: ldd $bin names no libstdc++.so.6"; exit 1; }
nm -D --defined-only "$stdlib" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$tmp/stdlib.syms"

# run NAME COMMAND...: COMMAND under LD_DEBUG=bindings into $tmp/NAME; 1 when it fails.
run() {
  local name=$1
  shift
  mkdir -p "$tmp/$name"
  (cd "$tmp/$name" && LD_DEBUG=bindings LD_DEBUG_OUTPUT="$tmp/$name/ld" "$@" >"$tmp/$name/out" 2>&1) ||
    { fail "$name: $* failed:"; sed 's/^/    /' "$tmp/$name/out"; return 1; }
}
starts() { cat "$tmp/$1"/ld.* | grep -c 'initialize program: '; }

# link NAME BINARY COMMAND...: part 1 for BINARY.
link() {
  local name=$1 who=$2 first
  shift 2
  first=$(readelf -d "$who" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | head -n 1)
  [ "$first" = libstdc++.so.6 ] || fail "$name: the first needed library of $who is $first, not libstdc++.so.6"
  run "$name" "$@" || return
  local log=$tmp/$name f
  # "binding file FROM [0] to TO [0]: normal symbol `NAME' [VERSION]"
  cat "$log"/ld.* | sed -n 's/.*binding file \([^ ]*\) \[[0-9]*\] to \([^ ]*\) \[[0-9]*\]: [a-z]* symbol `\([^'"'"']*\)'"'"'.*/\1 \2 \3/p' \
    >"$log/triples"
  cut -d' ' -f1 "$log/triples" | sort -u | while read -r f; do echo "$f $(readlink -f "$f")"; done >"$log/froms"
  # The binary's own lookups (not those of the libraries it loads), bound elsewhere
  # than in the binary itself (copy relocations of typeinfo and vtables are).
  awk -v who="$who" 'NR == FNR { if ($2 == who) keep[$1]; next }
    ($1 in keep) && $2 != $1 { print $2, $3 }' "$log/froms" "$log/triples" | sort -u >"$log/bound"
  local wrong fs
  wrong=$(awk 'NR == FNR { std[$1]; next } ($2 in std) && $1 !~ /libstdc\+\+\.so\.6$/' \
    "$tmp/stdlib.syms" "$log/bound")
  fs=$(grep -c ' _ZN[K]*St10filesystem' "$log/bound")
  if [ -n "$wrong" ]; then
    fail "$name: symbols of libstdc++.so.6 bound elsewhere ($(wc -l <<<"$wrong")):"
    head -n 10 <<<"$wrong" | sed 's/^/    /'
  elif [ "$fs" = 0 ]; then
    fail "$name: the command bound no std::filesystem symbol: it checks nothing"
  else
    echo "ok   $name: $(wc -l <"$log/bound") symbols bound, $fs of std::filesystem, all of libstdc++'s to it"
  fi
}

link launcher "$bin" "$bin" plan "$config" --output "$tmp/plan"
link unit_tests "$unit" "$unit" --gtest_filter='Files.AnAtomicWriteIntoAMissingDirectoryMakesIt'
if run guard_test "$unit" --gtest_filter='StdlibGuard.*'; then echo "ok   guard_test: StdlibGuard.* pass"; fi

# Part 2: the order forced wrong.
exporter=""
while read -r lib; do
  # grep -c, not -q: under pipefail a grep that leaves early fails the pipeline (SIGPIPE).
  if [ "$(nm -D --defined-only "$lib" 2>/dev/null | grep -c ' _ZNSt10filesystem10remove_all')" != 0 ]; then
    exporter=$lib
    break
  fi
done < <(ldd "$bin" | awk '$1 ~ /^lib(torch|c10)/ {print $3}')
if [ -z "$exporter" ]; then
  echo "note: no LibTorch library of $bin exports std::filesystem (Debian's): the forced order does not apply"
else
  echo "the order forced wrong: LD_PRELOAD=$exporter"
  mkdir -p "$tmp/control"
  if env LD_PRELOAD="$exporter" BATCHDIST_STDLIB_GUARD=off "$unit" --gtest_filter='StdlibGuard.*' \
       >"$tmp/control/out" 2>&1; then
    fail "control: without the guard StdlibGuard.* passed; it cannot see the fault"
  elif grep -qF "std::filesystem binds to $exporter" "$tmp/control/out"; then
    echo "ok   control: without the guard StdlibGuard.* fails, naming $exporter"
  else
    fail "control: StdlibGuard.* failed without naming $exporter:"; sed 's/^/    /' "$tmp/control/out"
  fi
  if run forced_unit_tests env LD_PRELOAD="$exporter" "$unit" --gtest_filter='StdlibGuard.*'; then
    if [ "$(starts forced_unit_tests)" = 3 ]; then echo "ok   forced_unit_tests: restarted once, StdlibGuard.* pass"
    else fail "forced_unit_tests: $(starts forced_unit_tests) program starts (env, the test, its restart: 3)"; fi
  fi
  if run forced_launcher env LD_PRELOAD="$exporter" "$bin" plan "$config" --output "$tmp/plan2"; then
    if [ "$(starts forced_launcher)" = 3 ]; then echo "ok   forced_launcher: batchdist plan restarted once and succeeded"
    else fail "forced_launcher: $(starts forced_launcher) program starts (env, batchdist, its restart: 3)"; fi
  fi
fi
[ "$fails" = 0 ] || { echo "stdlib_binding_test: $fails failed"; exit 1; }
echo "stdlib_binding_test: passed"

#!/usr/bin/env bash
# shellcheck over the scripts a user runs on a GPU node or an air-gapped one
# (bench/gpu_acceptance.sh, bench/device_kit.sh and its rehearsal), where a
# quoting slip costs a trip: their own tests (gpu_acceptance_script,
# device_kit_closure) run them but check only bash -n. Exits 77 (ctest: Skipped)
# naming what to install where shellcheck is not; never passes without it.
#   tests/shellcheck_test.sh SCRIPT...
set -uo pipefail
command -v shellcheck >/dev/null ||
  { echo "SKIP: shellcheck is not installed (Debian: apt-get install shellcheck)"; exit 77; }
shellcheck --version | sed -n 's/^version: /shellcheck /p'
fails=0
for s in "$@"; do
  if shellcheck "$s"; then echo "ok   $s"; else echo "FAIL $s"; fails=$((fails + 1)); fi
done
[ "$fails" = 0 ] || { echo "$fails of $# script(s) failed shellcheck"; exit 1; }

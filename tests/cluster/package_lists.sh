#!/usr/bin/env bash
# The container recipes install what the README installs: compares the package
# lists of every `apt-get install` in README.md's quickstart and test commands and
# in the Dockerfiles.
#   quickstart ⊆ test           (the test command builds and runs the same thing, plus tests)
#   CPU Dockerfile = test       (the CPU image builds batchdist and runs the suite)
#   CUDA Dockerfile ⊆ test      (its LibTorch, Gloo and NCCL come from the PyTorch base image)
# usage: package_lists.sh README.md docker/Dockerfile.cpu docker/Dockerfile.cuda
set -u
readme=$1 cpu=$2 cuda=$3

# Packages named by `apt-get install` in a text (continuation lines joined, options
# and shell operators dropped), one per line, sorted.
packages() {
  sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' |
    grep -o 'apt-get install[^&;|]*' |
    sed 's/^apt-get install//' | tr ' ' '\n' | grep -v '^-' | grep -v '^$' | sort -u
}
# The fenced sh block after an HTML marker in the README.
block() { awk -v m="<!-- $1 -->" '$0 == m {f=1; next} f && /^```sh/ {g=1; next} g && /^```/ {exit} g {print}' "$readme"; }

quick=$(block quickstart-command | packages)
test=$(block test-command | packages)
dcpu=$(grep -v '^\s*#' "$cpu" | packages)
dcuda=$(grep -v '^\s*#' "$cuda" | packages)
status=0
for name in quick test dcpu dcuda; do
  [ -n "${!name}" ] || { echo "FAIL: no apt-get install packages found for $name"; status=1; }
done
[ "$status" = 0 ] || exit 1
echo "README quickstart: $(echo $quick)"
echo "README test:       $(echo $test)"
echo "Dockerfile.cpu:    $(echo $dcpu)"
echo "Dockerfile.cuda:   $(echo $dcuda)"

only() { comm -23 <(echo "$1") <(echo "$2") | tr '\n' ' '; }
if [ -n "$(only "$quick" "$test")" ]; then
  echo "FAIL: in the README quickstart but not its test command: $(only "$quick" "$test")"; status=1
fi
if [ "$dcpu" != "$test" ]; then
  echo "FAIL: docker/Dockerfile.cpu and the README test command differ:"
  echo "  only in the Dockerfile: $(only "$dcpu" "$test")"
  echo "  only in the README:     $(only "$test" "$dcpu")"
  status=1
fi
if [ -n "$(only "$dcuda" "$test")" ]; then
  echo "FAIL: in docker/Dockerfile.cuda but not the README test command: $(only "$dcuda" "$test")"; status=1
fi
[ "$status" = 0 ] && echo "ok: the package lists agree"
exit "$status"

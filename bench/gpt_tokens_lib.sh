# Sourced by the GPT benchmarks (memory_levers.sh, lever_search.sh): checks
# $bin and the batchdist_make_data beside its build tree, sets $flags (mpirun's),
# makes $out and byte tokens of the GPL-3 Debian ships in $out/tokens.
make_data=$(dirname "$(dirname "$bin")")/tests/batchdist_make_data
[ -x "$bin" ] || { echo "no batchdist binary at $bin" >&2; exit 2; }
[ -x "$make_data" ] || { echo "no batchdist_make_data at $make_data" >&2; exit 2; }
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
mkdir -p "$out"
"$make_data" tokens --text /usr/share/common-licenses/GPL-3 --out "$out/tokens" >/dev/null

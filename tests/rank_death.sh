#!/usr/bin/env bash
# A rank that dies mid-training (here: SIGKILL, as the OOM killer would) takes
# the whole job down within seconds: no rank is left waiting in a collective.
# usage: rank_death.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG OUTDIR
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 out=$5
rm -rf "$out"; mkdir -p "$out"
# shellcheck disable=SC2086
"$mpirun" $flags -np 2 "$bin" "$cfg" --output "$out" --set train.epochs=100000 \
  --set dist.timeout_s=20 >"$out/log" 2>&1 &
launcher=$!
# Wait until training runs (progress lines), then kill rank 1.
for _ in $(seq 1 100); do
  grep -q "^epoch" "$out/log" 2>/dev/null && break
  sleep 0.2
done
pids=$(pgrep -f -- "--output $out --set train.epochs=100000" | grep -v "^$launcher\$" || true)
victim=""
for p in $pids; do
  # The batchdist processes are mpirun's children; the second is rank 1.
  if [ "$(ps -o comm= -p "$p")" = "batchdist" ]; then victim=$p; fi
done
if [ -z "$victim" ]; then
  echo "no running rank found"; cat "$out/log"; kill "$launcher"; exit 1
fi
start=$(date +%s)
kill -9 "$victim"
# The job must end by itself, well before any collective timeout.
for _ in $(seq 1 150); do
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.2
done
if kill -0 "$launcher" 2>/dev/null; then
  echo "job still running 30 s after a rank died"; kill -9 "$launcher"; exit 1
fi
wait "$launcher"; rc=$?
took=$(( $(date +%s) - start ))
echo "job ended ${took}s after rank pid $victim was killed, exit code $rc"
[ "$rc" -ne 0 ] || { echo "exit code 0 after a rank died"; exit 1; }
exit 0

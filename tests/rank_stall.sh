#!/usr/bin/env bash
# A rank frozen by SIGSTOP (a debugger, a stuck driver): the others give up after
# dist.timeout_s and the message names the rank that did not arrive, with its
# host (Note [stall report] in collective/process_group.cc). Rank 0 frozen takes
# the rendezvous store with it, and the message says that instead.
# usage: rank_stall.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG OUTDIR RANK
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 out=$5 frozen=$6
. "$(dirname "$0")/mpi_job_lib.sh"
start_long_job --set dist.timeout_s=5
victim=$(rank_pid_of "$frozen")
[ -n "$victim" ] || { echo "no running rank $frozen found"; cat "$out/log"; kill "$launcher"; exit 1; }
cleanup() { kill -9 "$victim" 2>/dev/null; kill -CONT "$victim" 2>/dev/null; }
trap cleanup EXIT
start=$(date +%s)
kill -STOP "$victim"
wait_for_job_end "rank $frozen was stopped"
echo "job ended $(( $(date +%s) - start ))s after rank $frozen (pid $victim) was stopped, exit code $rc"
grep -v "^epoch .* step" "$out/log" | grep -v "^ *$" | tail -12
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "exit code 0 after a rank froze"
if [ "$frozen" = 0 ]; then
  grep -q "rendezvous store on rank 0 does not answer" "$out/log" || fail "rank 0 not named"
else
  grep -q "Did not reach it: rank $frozen (host $(hostname))" "$out/log" || fail "rank $frozen not named"
fi
echo "ok: the stuck rank was named"

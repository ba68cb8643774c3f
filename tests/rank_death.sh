#!/usr/bin/env bash
# A rank that dies mid-training (here: SIGKILL, as the OOM killer would) takes
# the whole job down within seconds: no rank is left waiting in a collective.
# usage: rank_death.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG OUTDIR
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 out=$5
. "$(dirname "$0")/mpi_job_lib.sh"
start_long_job --set dist.timeout_s=20
victim=$(rank_pid)
[ -n "$victim" ] || { echo "no running rank found"; cat "$out/log"; kill "$launcher"; exit 1; }
start=$(date +%s)
kill -9 "$victim"
wait_for_job_end "a rank died"
echo "job ended $(( $(date +%s) - start ))s after rank pid $victim was killed, exit code $rc"
[ "$rc" -ne 0 ] || { echo "FAIL: exit code 0 after a rank died"; exit 1; }

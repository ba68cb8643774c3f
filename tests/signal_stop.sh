#!/usr/bin/env bash
# SIGTERM (or SIGUSR1) delivered to ONE rank, as a Slurm time limit or a
# preemption would: every rank stops after the same step, rank 0 writes the model
# and a report with completed=false, and the job exits 128+signal, with no hang.
# usage: signal_stop.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG OUTDIR SIGNAL
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 out=$5 sig=${6:-TERM}
. "$(dirname "$0")/mpi_job_lib.sh"
start_long_job --set dist.timeout_s=30
victim=$(rank_pid)
[ -n "$victim" ] || { echo "no running rank found"; cat "$out/log"; kill "$launcher"; exit 1; }
kill -"$sig" "$victim"
wait_for_job_end "SIG$sig"
grep -v "^epoch .* step" "$out/log" | tail -20
grep -q "received SIG$sig: stopped cleanly" "$out/log" || fail "no stop message"
grep -q "stop requested: every rank stopped after step" "$out/log" || fail "ranks did not agree"
[ -f "$out/report.json" ] || fail "no report"
[ -f "$out/model.pt" ] || fail "no model"
grep -q '"completed": false' "$out/report.json" || fail "report does not say completed=false"
grep -q "\"stopped_by\": \"SIG$sig\"" "$out/report.json" || fail "report does not name SIG$sig"
[ "$rc" -ne 0 ] || fail "exit code 0 for an interrupted run"
echo "ok: stopped on SIG$sig, exit code $rc"

#!/usr/bin/env bash
# SIGTERM during the batch search (of `search`, or of `train` with per_gpu: auto)
# stops every rank after the candidate being measured, not after the whole
# search: the job exits 128+15 within seconds, having trained nothing; the rank
# that got the signal names it, and rank 0 writes report.json ("completed": false,
# "stopped_by": "SIGTERM").
# usage: signal_search.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG OUTDIR VERB
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 out=$5 verb=$6
. "$(dirname "$0")/mpi_job_lib.sh"
# Slow candidates (many timed steps, a large cap) so the search would take minutes.
start_job "per-GPU 8 x accum" "$verb" "$cfg" --set search.timed_steps=40 --set search.max=4096 \
  --set dist.timeout_s=60 --set search.cache="$out/cache.json"
victim=$(rank_pid_of 1)
[ -n "$victim" ] || { echo "no running rank found"; cat "$out/log"; kill "$launcher"; exit 1; }
start=$(date +%s)
kill -TERM "$victim"
wait_for_job_end "SIGTERM during the search"
took=$(( $(date +%s) - start ))
echo "job ended ${took}s after SIGTERM, exit code $rc"
tail -8 "$out/log"
[ "$rc" -eq 143 ] || fail "exit code $rc, expected 143 (128 + SIGTERM)"
grep -q "stop requested during the batch search: every rank stopped after per-GPU" "$out/log" ||
  fail "no stop message"
grep -q "\[rank 1/2 host [^]]*\] received SIGTERM: the batch search stopped cleanly after per-GPU batch" \
  "$out/log" || fail "the rank that got the signal does not name it"
[ -f "$out/report.json" ] || fail "no report.json"
grep -q '"completed": false' "$out/report.json" || fail "report does not say completed=false"
grep -q '"stopped_by": "SIGTERM"' "$out/report.json" || fail "report does not name SIGTERM"
grep -q '"stopped_during": "batch search"' "$out/report.json" || fail "report does not say when"
grep -q '"steps": 0' "$out/report.json" || fail "report claims steps"
grep -q "epoch [0-9][0-9]*/" "$out/log" && fail "training started after the stop"
[ ! -f "$out/cache.json" ] || fail "an interrupted search was cached"
echo "ok: the search stopped after one candidate"

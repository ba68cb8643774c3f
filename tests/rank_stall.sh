#!/usr/bin/env bash
# Ranks frozen by SIGSTOP (a debugger, a stuck driver): the others give up after
# dist.timeout_s and the message names exactly the ranks that did not arrive,
# with their host, as ranges (Note [stall report] in collective/process_group.cc),
# not the ranks queued behind them, and every rank that reports says the same.
# Rank 0 frozen takes the rendezvous store with it, and the message says that instead.
# usage: rank_stall.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG OUTDIR "RANKS" [NP [SET...]]
#   RANKS: the ranks to freeze, e.g. "1" or "40 41"; NP: the world size (default 2)
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 out=$5 frozen=$6 np=${7:-2}
shift $(( $# < 7 ? $# : 7 ))
. "$(dirname "$0")/mpi_job_lib.sh"
timeout_s=5
[ "$np" -gt 8 ] && timeout_s=15  # oversubscribed: the live ranks need time to be scheduled
start_wait_s=$(( 30 + np * 2 ))
# Frozen in training: a few steps after the model line (progress lines may start
# with a carriage return, so "^epoch" is not waited for).
start_job "^model: " "$cfg" --set dist.timeout_s=$timeout_s --set train.threads=1 "$@"
grep -q "^model: " "$out/log" || { echo "FAIL: training did not start in ${start_wait_s} s"; tail -5 "$out/log"; kill "$launcher"; exit 1; }
sleep 2
victims=()
for r in $frozen; do
  pid=$(rank_pid_of "$r")
  [ -n "$pid" ] || { echo "no running rank $r found"; tail -20 "$out/log"; kill "$launcher"; exit 1; }
  victims+=("$pid")
done
cleanup() { for p in "${victims[@]}"; do kill -9 "$p" 2>/dev/null; kill -CONT "$p" 2>/dev/null; done; }
trap cleanup EXIT
start=$(date +%s)
kill -STOP "${victims[@]}"
# The report's bound: dist.timeout_s + the arrivals' spread + the quiet period (5 s)
# + 15 s for the store's first answer; oversubscribed start-up and teardown on top.
end_wait_s=$(( timeout_s + 60 + np ))
wait_for_job_end "ranks $frozen were stopped"
echo "job ended $(( $(date +%s) - start ))s after ranks $frozen (pids ${victims[*]}) were stopped, exit code $rc"
grep -v "^epoch .* step" "$out/log" | grep -v "^ *$" | tail -12 | cut -c1-400
[ "$rc" -ne 0 ] || fail "exit code 0 after a rank froze"
if [ "$frozen" = 0 ]; then
  grep -q "rendezvous store on rank 0 does not answer" "$out/log" || fail "rank 0 not named"
  exit 0
fi
# The frozen ranks themselves may print after the job's abort wakes them (Open MPI
# sends SIGCONT before SIGTERM), when rank 0 is gone: their lines do not count.
others=$(grep -a "error: " "$out/log" | grep -avE "^\[rank ($(echo $frozen | tr ' ' '|'))/")
printf '%s\n' "$others" | grep -q "rendezvous store on rank 0 does not answer" && fail "rank 0 blamed while it was alive"
# "rank 1" or "ranks 40-41" (consecutive ranks as a range)
set -- $frozen
if [ $# = 1 ]; then who="rank $1"; else who="ranks $1-${!#}"; fi
expect="Did not reach it: $who (host $(hostname));"
verdicts=$(printf '%s\n' "$others" | grep -o "Did not reach it: .*" | sort -u)
[ -n "$verdicts" ] || fail "no rank named the stopped ones"
[ "$(printf '%s\n' "$verdicts" | wc -l)" = 1 ] || fail "the ranks that reported disagree:
$verdicts"
case "$verdicts" in *"$expect"*) ;; *) fail "expected '$expect', got: $verdicts" ;; esac
[ "${#verdicts}" -lt 400 ] || fail "the verdict is ${#verdicts} characters long"
echo "ok: $(grep -c "Did not reach it" "$out/log") report(s), all naming exactly $who"

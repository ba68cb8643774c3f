#!/usr/bin/env bash
# Profiler traces (Note [step profiler]) of real runs, checked by profile_check.py.
# usage: profile_trace.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG OUTDIR SCENARIO
#   np2    2 ranks, profile wait 2 warmup 1 active 3 over 9 steps: steps 4-6 traced
#          on each rank, every phase and the bucket's allreduce inside each step
#          (dist.backend auto: MPI on one host; the bucket's range ends at its test)
#   gloo   the same over Gloo in 0.02 MB buckets (4, launched during backward, in
#          flight together; their ranges ended from Gloo's thread)
#   short  1 rank, active 5 from step 3 of a 4-step run: the run's end writes
#          steps 3-4
#   off    no profile section: no profile directory, no "profile" in report.json
#   unwritable  OUTPUT/profile is a file: each rank says it could not write its
#          trace, the run completes, report.json's profile has the error
#   search 2 ranks, search.profile: each candidate's directory under
#          OUTPUT/profile/search holds one trace per rank of one step with every
#          phase; search.json names rank 0's per candidate; a second run reads the
#          search from the cache and says nothing was traced
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 out=$5 scenario=$6
. "$(dirname "$0")/mpi_job_lib.sh"
own_scratch_out
check="$(dirname "$0")/profile_check.py"
common=(--set train.threads=1 --set batch.per_gpu=16 --set train.progress=off)
case "$scenario" in
  np2|gloo)
    backend=auto
    buckets=25
    [ "$scenario" = gloo ] && backend=gloo buckets=0.02
    run_into run 2 "${common[@]}" --set train.max_steps=9 --set profile.wait=2 --set profile.warmup=1 \
      --set profile.active=3 --set dist.backend=$backend --set dist.bucket_mb=$buckets
    [ "$rc" = 0 ] || { cat "$out/run.log"; fail "exit $rc"; }
    grep -q "profile: steps 4-6 traced (" "$out/run.log" || { cat "$out/run.log"; fail "no profile line"; }
    python3 "$check" "$out/run" 2 4 5 6 "--buckets=$([ "$scenario" = gloo ] && echo 4 || echo 1)" || exit 1
    # bench/trace_phases.py: each phase's share of the traced steps.
    python3 "$(dirname "$0")/../bench/trace_phases.py" --json "$out/run/profile" >"$out/phases.json" ||
      fail "trace_phases.py failed"
    python3 - "$out/phases.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
m = r["median"]
assert r["steps"] == [4, 5, 6] and r["file"].endswith("_rank0.pt.trace.json"), r
phases = ["data_wait", "host_to_device", "forward", "backward", "gradient_sync", "optimizer"]
assert all(0 <= m[k] <= 1 for k in phases + ["other"]), m
assert m["forward"] > 0 and m["backward"] > 0 and m["optimizer"] > 0 and m["gradient_sync"] > 0, m
for row in r["per_step"]:  # each moment of a step counted at least once (medians need not add up)
    assert sum(row[k] for k in phases) + row["other"] >= 0.99, row
assert "gpu_busy" not in m  # no device activity on the CPU
print("ok: trace_phases.py: " + ", ".join(f"{k} {100 * m[k]:.0f} %" for k in phases + ["other"]))
PY
    ;;
  short)
    run_into run 1 "${common[@]}" --set train.max_steps=4 --set profile.wait=1 --set profile.warmup=1 \
      --set profile.active=5
    [ "$rc" = 0 ] || { cat "$out/run.log"; fail "exit $rc"; }
    python3 "$check" "$out/run" 1 3 4 --no-buckets || exit 1
    ;;
  off)
    run_into run 1 "${common[@]}" --set train.max_steps=3
    [ "$rc" = 0 ] || { cat "$out/run.log"; fail "exit $rc"; }
    [ ! -e "$out/run/profile" ] || fail "a profile directory without a profile section"
    [ "$(json run profile 2>/dev/null)" = "" ] || fail "report.json has a profile without a profile section"
    echo "ok: no profile section, no trace"
    ;;
  unwritable)
    mkdir -p "$out/run" && echo "not a directory" >"$out/run/profile"
    run_into run 2 "${common[@]}" --set train.max_steps=6 --set profile.wait=1 --set profile.warmup=0 \
      --set profile.active=2
    [ "$rc" = 0 ] || { cat "$out/run.log"; fail "exit $rc: a trace that cannot be written ended the run"; }
    for r in 0 1; do
      grep -q "rank $r: profile: warning: could not write $out/run/profile/.*_rank$r.pt.trace.json" "$out/run.log" ||
        { cat "$out/run.log"; fail "rank $r does not say its trace was not written"; }
    done
    [ "$(json run completed)" = True ] || fail "report: not completed"
    json run profile error | grep -q "could not write" || fail "report.json's profile has no error: $(json run profile)"
    echo "ok: an unwritable profile directory is said by each rank; the run completes"
    ;;
  search)
    search=(--set batch.per_gpu=auto --set search.min=8 --set search.max=32 --set search.rounds=0
            --set search.min_time_s=0.01 --set search.max_time_s=0.05 --set search.profile=true)
    run_into run 2 "${common[@]}" "${search[@]}" --set train.max_steps=3
    [ "$rc" = 0 ] || { cat "$out/run.log"; fail "exit $rc"; }
    grep -q "profile: one step of [0-9]* of [0-9]* search candidate(s) traced: $out/run/profile/search/<candidate>/ (one file per rank); search.json names them" \
      "$out/run.log" || { cat "$out/run.log"; fail "no search profile line"; }
    dirs=$(cd "$out/run/profile/search" && ls) || fail "no OUTPUT/profile/search"
    [ "$(echo "$dirs" | wc -l)" -ge 2 ] || fail "traces of fewer than 2 candidates: $dirs"
    for d in $dirs; do
      python3 "$check" "$out/run" 2 --dir="profile/search/$d" --one-step --no-report || exit 1
    done
    python3 - "$out/run" <<'PY' || exit 1
import json, os, sys
s = json.load(open(sys.argv[1] + "/search.json"))
fit = [c for c in s["candidates"] if not c.get("failed")]
for c in fit:
    t = c.get("trace", "")
    accum = c.get("accum_steps", 1)
    want = f"per_gpu_{c['per_gpu_batch']}" + (f"_accum_{accum}" if accum > 1 else "")
    assert os.path.basename(os.path.dirname(t)) == want and t.endswith("_rank0.pt.trace.json") \
        and os.path.isfile(t), (want, t)
print(f"ok: search.json names rank 0's trace of each of {len(fit)} candidates")
PY
    [ ! -e "$out/run/profile/"*.pt.trace.json ] || fail "a training trace without a profile section"
    run_into again 2 "${common[@]}" "${search[@]}" --set train.max_steps=3 --set search.cache="$out/run/search_cache.json"
    expect_error again 0 "profile: the search was read from the cache, so no candidate was traced (--research measures it again)"
    ;;
  *) fail "unknown scenario $scenario" ;;
esac

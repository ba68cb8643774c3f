#!/usr/bin/env bash
# Rank 0's logs as a user keeps them (Note [progress output], Note [streamed metrics]).
# usage: logs.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG OUTDIR SCENARIO
#   progress_file      output redirected to a file or a pipe: plain progress lines, no \r,
#                      no escape codes (train.progress auto); `bar` and `off` do as told
#   progress_terminal  mpirun's output a terminal (script(1)): auto draws the bar in place
#   metrics_kill9      kill -9 of the whole job mid-run: every metrics.jsonl line parses and
#                      the steps increase; the resumed run continues the file to the end
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 out=$5 scenario=$6
fail() { echo "FAIL: $*"; exit 1; }
cr=$'\r' esc=$'\033'

# run NAME ARGS...: a 2-rank quickstart run into $out/NAME, its output in $out/NAME.log.
run() {
  local name=$1; shift
  rm -rf "$out/$name"
  # shellcheck disable=SC2086
  "$mpirun" $flags -np 2 "$bin" "$cfg" --output "$out/$name" "$@" >"$out/$name.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || { tail -20 "$out/$name.log"; fail "$name: exit $rc"; }
}
# No carriage return and no escape code in a file a person reads with less or grep.
plain() {
  if grep -q "[$cr$esc]" "$1"; then
    grep -n "[$cr$esc]" "$1" | head -3 | cat -A
    fail "$1 has carriage returns or escape codes"
  fi
}
# The checks of metrics.jsonl: every line an object; step lines' steps strictly increasing,
# no line's step below the one before. Prints "LINES LAST_STEP".
check_metrics() {
  python3 - "$1" <<'PY' || fail "metrics.jsonl: see above"
import json, sys
last = last_step_line = -1
n = 0
with open(sys.argv[1], "rb") as f:
    data = f.read()
if data and not data.endswith(b"\n"):
    sys.exit("the last line is not complete")
for i, line in enumerate(data.decode().splitlines(), 1):
    try:
        j = json.loads(line)
    except ValueError as e:
        sys.exit(f"line {i} does not parse: {e}: {line[:80]!r}")
    s = j["step"]
    if s < last:
        sys.exit(f"line {i}: step {s} after step {last}")
    if j["kind"] == "step":
        if s <= last_step_line:
            sys.exit(f"line {i}: step line {s} after step line {last_step_line}")
        last_step_line = s
    last = s
    n += 1
print(n, last)
PY
}

mkdir -p "$out"
case "$scenario" in
  progress_file)
    run auto --set train.epochs=3
    plain "$out/auto.log"
    grep -q '^epoch 1/3 step [0-9]*/[0-9]*  loss' "$out/auto.log" || { cat "$out/auto.log"; fail "no plain progress line"; }
    grep -q '^epoch 3/3  train_loss' "$out/auto.log" || fail "no epoch line"
    # A pipe, as `| tee log` makes.
    rm -rf "$out/pipe"
    # shellcheck disable=SC2086
    "$mpirun" $flags -np 2 "$bin" "$cfg" --output "$out/pipe" --set train.epochs=2 2>&1 | cat >"$out/pipe.log"
    plain "$out/pipe.log"
    grep -q '^epoch 1/2 step ' "$out/pipe.log" || fail "no plain progress line through a pipe"
    run bar --set train.epochs=2 --set train.progress=bar
    grep -q "${cr}${esc}\[K" "$out/bar.log" || fail "train.progress: bar drew no bar"
    run off --set train.epochs=2 --set train.progress=off
    plain "$out/off.log"
    if grep -q ' step [0-9]*/' "$out/off.log"; then fail "train.progress: off printed progress"; fi
    grep -q '^epoch 2/2  train_loss' "$out/off.log" || fail "train.progress: off dropped the epoch lines"
    echo "ok: $(grep -c ' step [0-9]*/' "$out/auto.log") plain progress line(s) in a file, bar and off as told"
    ;;
  progress_terminal)
    command -v script >/dev/null || fail "script(1) not found (Debian: bsdutils)"
    rm -rf "$out/tty"
    # shellcheck disable=SC2086
    script -qec "$mpirun $flags -np 2 $bin $cfg --output $out/tty --set train.epochs=2" \
      "$out/tty.typescript" >/dev/null 2>&1 </dev/null || { cat "$out/tty.typescript"; fail "the run under script(1) failed"; }
    grep -q "${cr}${esc}\[Kepoch 1/2 step " "$out/tty.typescript" ||
      { cat -A "$out/tty.typescript" | head -20; fail "auto drew no bar although mpirun's output is a terminal"; }
    echo "ok: auto draws the bar when mpirun's output is a terminal"
    ;;
  metrics_kill9)
    . "$(dirname "$0")/mpi_job_lib.sh"
    job=(--set checkpoint.every_steps=20 --set train.threads=1)
    start_long_job "${job[@]}"
    # Past a few checkpoints, with metrics lines written after the last of them.
    for _ in $(seq 1 300); do
      [ "$(grep -c . "$out/metrics.jsonl" 2>/dev/null || echo 0)" -ge 60 ] && break
      sleep 0.1
    done
    pids="$launcher $(rank_pid_of 0) $(rank_pid_of 1)"
    # shellcheck disable=SC2086
    kill -9 $pids
    wait "$launcher" 2>/dev/null
    sleep 0.5
    read -r lines last < <(check_metrics "$out/metrics.jsonl")
    [ "${lines:-0}" -ge 60 ] || fail "only ${lines:-0} metrics lines before the kill (expected >= 60)"
    cp "$out/metrics.jsonl" "$out/killed.jsonl"
    # Resume from the last checkpoint, 40 steps past the kill.
    end=$(( last + 40 ))
    # shellcheck disable=SC2086
    "$mpirun" $flags -np 2 "$bin" "$cfg" --output "$out" --set train.epochs=100000 "${job[@]}" \
      --set train.max_steps=$end --resume auto >"$out/resumed.log" 2>&1 ||
      { tail -20 "$out/resumed.log"; fail "the resumed run failed"; }
    from=$(sed -n 's/.*resume: continuing from .*(step \([0-9]*\).*/\1/p' "$out/resumed.log" | head -1)
    [ -n "$from" ] || fail "the second run did not resume"
    read -r lines2 last2 < <(check_metrics "$out/metrics.jsonl")
    [ "$last2" = "$end" ] || fail "metrics.jsonl ends at step $last2, expected $end"
    # The lines up to the checkpoint's step are the killed run's, unchanged.
    python3 - "$out/killed.jsonl" "$out/metrics.jsonl" "$from" <<'PY' || fail "the resumed run did not continue the file"
import json, sys
old = [l for l in open(sys.argv[1]).read().splitlines() if json.loads(l)["step"] <= int(sys.argv[3])]
new = open(sys.argv[2]).read().splitlines()
if not old or new[:len(old)] != old:
    sys.exit(f"the first {len(old)} lines differ from the killed run's")
if json.loads(new[len(old)])["step"] <= int(sys.argv[3]):
    sys.exit("the resumed run repeated a step at or before the checkpoint")
PY
    echo "ok: $lines lines (to step $last) survived kill -9; resumed at step $from; $lines2 lines to step $last2"
    ;;
  *) fail "unknown scenario '$scenario'" ;;
esac

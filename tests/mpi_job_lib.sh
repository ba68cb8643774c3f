# Shared by the tests that run batchdist jobs under mpirun (rank_death.sh,
# signal_stop.sh, checkpoint_resume.sh, ...). Source it; set mpirun, flags, bin,
# cfg and out first.

fail() { echo "FAIL: $*"; exit 1; }

# Note [scratch dirs] (tests/scratch_dir.h): $out becomes OUTDIR.XXXXXX, this run's
# own; removed when the script succeeds, kept on failure.
own_scratch_out() {
  mkdir -p "$(dirname "$out")"
  out=$(mktemp -d "$out.XXXXXX") || { echo "FAIL: mktemp -d $out.XXXXXX"; exit 1; }
  trap 'rc_=$?; [ "$rc_" = 0 ] && rm -rf "$out"; exit "$rc_"' EXIT
}

# json RUN KEY...: a value of $out/RUN/report.json (a number KEY indexes a list).
json() {
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2:]: d = d[int(k)] if isinstance(d, list) else d[k]
print(d)' "$out/$1/report.json" "${@:2}"
}

# expect_error NAME CODE TEXT...: the run NAME exited CODE, and each TEXT is in its log.
expect_error() {
  local name=$1 code=$2; shift 2
  [ "$rc" = "$code" ] || { cat "$out/$name.log"; fail "$name: exit $rc, expected $code"; }
  for text in "$@"; do
    grep -qF -- "$text" "$out/$name.log" || { cat "$out/$name.log"; fail "$name: no '$text' in the log"; }
  done
  echo "ok: $name: exit $code, names: $*"
}

# run_into NAME NP ARGS...: `batchdist CFG ARGS... --output $out/NAME` on NP ranks,
# its log in $out/NAME.log; sets rc to the job's exit code.
run_into() {
  local name=$1 np=$2; shift 2
  # shellcheck disable=SC2086
  "$mpirun" $flags -np "$np" "$bin" "$cfg" --output "$out/$name" "$@" >"$out/$name.log" 2>&1
  rc=$?
}

# Starts a long 2-rank training run in the background; its pid is $launcher.
# (Not anchored: with train.progress: bar a progress line starts with an escape code.)
start_long_job() { start_job "epoch [0-9][0-9]*/" "$cfg" "$@"; }

# Starts `batchdist ARGS... --output $out --set train.epochs=100000` on $np ranks
# (default 2) in the background (pid $launcher) and waits until its log matches
# PATTERN (up to $start_wait_s seconds, default 30).
start_job() {
  local pattern=$1; shift
  rm -rf "$out"; mkdir -p "$out"
  # shellcheck disable=SC2086
  "$mpirun" $flags -np "${np:-2}" "$bin" "$@" --output "$out" --set train.epochs=100000 \
    >"$out/log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 $(( ${start_wait_s:-30} * 5 ))); do
    grep -q "$pattern" "$out/log" 2>/dev/null && break
    sleep 0.2
  done
}

# The pid of this job's batchdist rank RANK (from its environment), or nothing.
rank_pid_of() {
  for p in $(pgrep -f -- "--output $out --set train.epochs=100000"); do
    [ "$(ps -o comm= -p "$p")" = "batchdist" ] || continue
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$p"; return
    fi
  done
}

# Prints the pid of a batchdist rank of this job (mpirun's last child), or nothing.
rank_pid() {
  local victim=""
  for p in $(pgrep -f -- "--output $out --set train.epochs=100000"); do
    if [ "$(ps -o comm= -p "$p")" = "batchdist" ]; then victim=$p; fi
  done
  echo "$victim"
}

# Waits up to $end_wait_s seconds (default 30) for the job to end by itself; sets
# $rc to its exit code, or kills it and fails.
wait_for_job_end() {
  for _ in $(seq 1 $(( ${end_wait_s:-30} * 5 ))); do
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$launcher" 2>/dev/null; then
    echo "FAIL: job still running ${end_wait_s:-30} s after $1"; kill -9 "$launcher"; exit 1
  fi
  wait "$launcher"; rc=$?
}

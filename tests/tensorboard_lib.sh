# Shared by the tests that serve a log directory with TensorBoard
# (tensorboard_browser.sh, profile_tensorboard.sh). Source it; define fail first.

# start_tensorboard VENV LOGDIR LOG: TensorBoard from VENV on LOGDIR, its output in
# LOG, killed on exit; sets tb_pid and url. --port 0: TensorBoard binds a port the
# kernel picks and prints its URL (a port probed free and bound later could be
# taken in between by a test running beside this one). Fails naming the cause
# when no address comes within 60 s.
start_tensorboard() {
  local venv=$1 logdir=$2 log=$3
  "$venv/bin/tensorboard" --logdir "$logdir" --host 127.0.0.1 --port 0 >"$log" 2>&1 &
  tb_pid=$!
  trap 'kill "$tb_pid" 2>/dev/null; wait "$tb_pid" 2>/dev/null' EXIT
  url=""
  for _ in $(seq 1 300); do  # bounded: 60 s
    url=$(grep -ao 'http://127\.0\.0\.1:[0-9][0-9]*' "$log" | head -1)
    [ -n "$url" ] && return 0
    kill -0 "$tb_pid" 2>/dev/null || break
    sleep 0.2
  done
  tail -n 20 "$log"
  fail "TensorBoard printed no address within 60 s (above)"
}

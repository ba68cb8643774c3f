#!/usr/bin/env bash
# batchdist elastic on four hosts made of network namespaces (Note [elastic
# supervisor]): hosts 10.78.0.1-4 (interface bd0 in each) on a bridge in a fifth
# namespace, where the supervisor and mpirun run (a login node, 10.78.0.254).
# Open MPI's launch agent starts its daemon for a host inside that host's
# namespace; the file system is shared, as a cluster's would be.
#
# usage: elastic_netns.sh MPIRUN "MPI FLAGS" BATCHDIST MODEL_DIFF CONFIG SCENARIO
#   kill9      kill -9 of host 4's rank mid-run: the job finishes on 3 ranks, G = 96 in
#              both attempts (24 x 1 x 4, then 16 x 2 x 3), and the model equals bitwise
#              a run resumed by hand from the same checkpoint on 3 ranks
#   sigstop    SIGSTOP of host 4's rank: lost within elastic.heartbeat_timeout_s + 5 s,
#              host 4 named; finishes on 3 ranks
#   hang       host 4's rank hangs before step 8 outside any collective, its heartbeat
#              beating (BATCHDIST_FAULT_HANG): every rank has done 7 steps, the
#              supervisor names rank 3 by the collectives started, within
#              elastic.stall_s + 5 s; finishes on 3 ranks
#   link_down  host 4's link down: a silent host, lost by heartbeat; when the link is up
#              again it answers, rejoins after elastic.readmit_s and the job grows back
#              to 4 ranks with no step lost
#   no_split   slots 2, 2, 1, 1 (6 ranks); host 4 lost leaves 5 slots: G = 96 has no
#              equal split on 5, so 4 ranks, and the supervisor says why
#   min_ranks  --min-ranks 4: host 4 lost, it waits elastic.wait_s, then gives up (exit
#              1) naming the lost host and the checkpoint to resume from
#   max_restarts --max-restarts 0: the first failure ends it (exit 1)
#   stop       SIGTERM to the supervisor: the job checkpoints at the next step boundary,
#              the supervisor exits 143 without a relaunch
# Exit 77 (ctest SKIP_RETURN_CODE) with the reason when namespaces cannot be made here.
set -u
mpirun=$1 flags=$2 bin=$3 diff=$4 cfg=$5 scenario=$6

command -v ip >/dev/null 2>&1 || { echo "SKIP: ip (iproute2) is not installed: apt-get install iproute2"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }

tag="$$-$RANDOM"
ns_s="bde-$tag-s"
ns() { echo "bde-$tag-$1"; }
dir=$(mktemp -d /tmp/batchdist-elastic.XXXXXX)
cleanup() {
  local n pid
  for n in s 1 2 3 4; do
    for pid in $(ip netns pids "$(ns "$n")" 2>/dev/null); do kill -CONT "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null; done
    ip netns del "$(ns "$n")" 2>/dev/null
  done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() { echo "FAIL: $*"; [ -f "$dir/log" ] && grep -v ' step ' "$dir/log" | tail -n 40; exit 1; }

if ! err=$(ip netns add "$ns_s" 2>&1); then
  echo "SKIP: cannot create a network namespace here ($err); this test needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN"
  exit 77
fi
ip -n "$ns_s" link add br0 type bridge || fail "bridge"
ip -n "$ns_s" addr add 10.78.0.254/24 dev br0 && ip -n "$ns_s" link set br0 up && ip -n "$ns_s" link set lo up || fail "bridge up"
for h in 1 2 3 4; do
  ip netns add "$(ns $h)" || fail "ip netns add"
  ip link add bd0 netns "$(ns $h)" type veth peer name "p$h" netns "$ns_s" || fail "veth $h"
  ip -n "$ns_s" link set "p$h" master br0 && ip -n "$ns_s" link set "p$h" up || fail "port $h"
  ip -n "$(ns $h)" addr add "10.78.0.$h/24" dev bd0 || fail "address $h"
  ip -n "$(ns $h)" link set lo up && ip -n "$(ns $h)" link set bd0 up || fail "link up $h"
done

cat >"$dir/agent.sh" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
  10.78.0.[1-4]) ns=bde-$tag-\${host##*.} ;;
  *) echo "netns agent: no namespace for host '\$host'" >&2; exit 1 ;;
esac
# A session directory of its own per host, as separate machines would have (all
# namespaces share /tmp and the host name; orted's topology file would collide).
mkdir -p "$dir/tmp-\${host##*.}"
exec ip netns exec "\$ns" env OMPI_MCA_orte_tmpdir_base="$dir/tmp-\${host##*.}" sh -c "\$*"
EOF
chmod +x "$dir/agent.sh"

slots=(1 1 1 1)
write_hosts() { : >"$dir/hosts"; for h in 1 2 3 4; do echo "10.78.0.$h slots=${slots[$((h - 1))]}" >>"$dir/hosts"; done; }

# The job: 20 ms more per optimizer update, so that it runs long enough to be hurt.
export BATCHDIST_FAULT_SLOW_UPDATE_US=20000
mpi_args="$flags --mca plm_rsh_agent $dir/agent.sh --mca oob_tcp_if_include 10.78.0.0/24 --mca btl_tcp_if_include 10.78.0.0/24 --mca btl self,tcp -x BATCHDIST_FAULT_SLOW_UPDATE_US"
job=(--set train.epochs=12 --set train.threads=1 --set batch.global=96 --set batch.per_gpu=24
     --set checkpoint.every_steps=5 --set checkpoint.keep=1000 --set dist.backend=gloo
     --set dist.timeout_s=30 --set train.progress=off
     --set elastic.heartbeat_s=0.5 --set elastic.heartbeat_timeout_s=3 --set elastic.readmit_s=600)

# Starts the supervisor in the background (pid $sup), output in $dir/log.
start() {
  write_hosts
  # shellcheck disable=SC2086
  timeout 300 ip netns exec "$ns_s" "$bin" elastic "$cfg" --hosts "$dir/hosts" --mpirun "$mpirun" \
    --mpirun-args "$mpi_args" --output "$dir/out" "${job[@]}" "$@" >"$dir/log" 2>&1 &
  sup=$!
}
wait_for() {  # wait_for PATTERN SECONDS
  for _ in $(seq 1 $(($2 * 20))); do
    grep -q -- "$1" "$dir/log" 2>/dev/null && return 0
    kill -0 "$sup" 2>/dev/null || break
    sleep 0.05
  done
  fail "no '$1' in the log within $2 s"
}
finish() { wait "$sup"; rc=$?; grep -v " step " "$dir/log" | grep -E "^elastic|error|gave up|done:|warning" | tail -n 30; echo "exit code $rc"; }
# The batchdist ranks of host H.
ranks_on() { for p in $(ip netns pids "$(ns "$1")"); do [ "$(ps -o comm= -p "$p" 2>/dev/null)" = batchdist ] && echo "$p"; done; }
at_step() {  # waits until a checkpoint past step 10 was written, i.e. mid-run
  for _ in $(seq 1 1200); do
    ls -d "$dir"/out/checkpoints/step-0000001[0-9]* >/dev/null 2>&1 && return 0
    kill -0 "$sup" 2>/dev/null || break
    sleep 0.05
  done
  fail "no checkpoint past step 10"
}
elapsed() { awk "BEGIN{printf \"%.1f\", $t_lost - $t_fault}"; }
report() { python3 -c "import json,sys; r=json.load(open('$dir/out/report.json')); print(eval(sys.argv[1]))" "$1"; }
check_completed_on() {  # check_completed_on WORLD
  [ "$rc" = 0 ] || fail "exit code $rc"
  [ "$(report "r['completed']")" = True ] || fail "report: not completed"
  [ "$(report "r['elastic']['attempts'][-1]['world']")" = "$1" ] || fail "the last attempt's world is not $1"
  [ "$(report "sorted(set(a['global'] for a in r['elastic']['attempts']))")" = "[96]" ] ||
    fail "G changed: $(report "[a['global'] for a in r['elastic']['attempts']]")"
}

case "$scenario" in
  kill9)
    start
    at_step
    t_fault=$(date +%s.%N)
    for p in $(ranks_on 4); do kill -9 "$p"; done
    wait_for "host 10.78.0.4 is lost" 20
    t_lost=$(date +%s.%N)
    finish
    check_completed_on 3
    grep -q "rank 3 on 10.78.0.4 was killed by signal 9" "$dir/log" || fail "the cause does not name rank 3 on host 4"
    [ "$(report "r['elastic']['attempts'][1]['per_gpu'], r['elastic']['attempts'][1]['accum']")" = "(16, 2)" ] ||
      fail "the split on 3 ranks is not 16 x 2"
    step=$(report "r['elastic']['attempts'][1]['start_step']")
    ckpt=$(ls -d "$dir"/out/checkpoints/step-$(printf '%08d' "$step")* | head -1)
    [ -d "$ckpt" ] || fail "no checkpoint of step $step"
    # The reference: the same checkpoint resumed by hand on 3 ranks (one host).
    # shellcheck disable=SC2086
    BATCHDIST_FAULT_SLOW_UPDATE_US=0 "$mpirun" $flags -np 3 "$bin" "$cfg" --output "$dir/ref" "${job[@]}" \
      --set batch.per_gpu=16 --set batch.accum=2 --resume "$ckpt" >"$dir/ref.log" 2>&1 ||
      { tail -n 20 "$dir/ref.log"; fail "the reference run failed"; }
    "$diff" "$dir/ref/model.pt" "$dir/out/model.pt" 0 || fail "the model differs from the reference's"
    echo "ok: lost in $(elapsed) s; resumed at step $step on 3 ranks; model bitwise equal to the reference"
    ;;
  sigstop)
    start
    at_step
    t_fault=$(date +%s.%N)
    for p in $(ranks_on 4); do kill -STOP "$p"; done
    wait_for "lost rank(s): rank 3 silent for" 20
    t_lost=$(date +%s.%N)
    finish
    check_completed_on 3
    secs=$(elapsed)
    awk "BEGIN{exit !($secs <= 8)}" || fail "lost after $secs s (heartbeat timeout 3 s)"
    grep -q "rank 3 silent for" "$dir/log" || fail "the cause does not name the silent rank"
    echo "ok: a stopped rank lost in $secs s, host 10.78.0.4 named; finished on 3 ranks"
    ;;
  hang)
    export BATCHDIST_FAULT_HANG=3:8
    mpi_args+=" -x BATCHDIST_FAULT_HANG"
    start --set elastic.stall_s=4
    wait_for "rank 3: hanging before step 8" 60
    t_fault=$(date +%s.%N)
    wait_for "hang: no step finished for" 20
    t_lost=$(date +%s.%N)
    finish
    check_completed_on 3
    secs=$(elapsed)
    awk "BEGIN{exit !($secs <= 9)}" || fail "the hang found after $secs s (elastic.stall_s 4)"
    grep -q "the last step done is 7; behind in collectives started ([0-9]*, the others up to [0-9]*): 1 rank(s) the others wait for on host(s) 10.78.0.4" "$dir/log" ||
      fail "the hang does not name host 4's rank alone"
    echo "ok: a hang found in $secs s, rank 3 on 10.78.0.4 named; finished on 3 ranks;" \
      "lost steps $(report "r['elastic']['attempts'][0]['lost_steps']")"
    ;;
  link_down)
    # Long enough at 3 ranks for host 4 to answer again (a probe gives up after
    # probe_timeout_s) and rejoin (readmit_s) before the job ends.
    start --set elastic.readmit_s=2 --set elastic.probe_timeout_s=2 --set train.epochs=30
    at_step
    t_fault=$(date +%s.%N)
    ip -n "$ns_s" link set p4 down
    wait_for "lost rank(s): rank 3 silent for" 20
    t_lost=$(date +%s.%N)
    wait_for "attempt 2 trains from step" 60
    ip -n "$ns_s" link set p4 up
    wait_for "relaunching on the new world" 60
    finish
    check_completed_on 4
    [ "$(report "r['elastic']['attempts'][1]['planned'], r['elastic']['attempts'][1]['lost_steps']")" = "(True, 0)" ] ||
      fail "growing back lost steps"
    echo "ok: silent host lost in $(elapsed) s; grew back to 4 ranks with 0 steps lost"
    ;;
  no_split)
    slots=(2 2 1 1)
    job+=(--set batch.per_gpu=16)
    start
    at_step
    for p in $(ranks_on 4); do kill -9 "$p"; done
    finish
    check_completed_on 4
    grep -q "passed over 5 ranks: G=96 is not divisible by 5" "$dir/log" || fail "the supervisor does not say why not 5"
    echo "ok: 6 -> 4 ranks, 5 passed over"
    ;;
  min_ranks)
    start --min-ranks 4 --set elastic.wait_s=3
    at_step
    for p in $(ranks_on 4); do kill -9 "$p"; done
    finish
    [ "$rc" = 1 ] || fail "exit code $rc, expected 1"
    grep -q "gave up: fewer than --min-ranks 4 rank(s) for 3 s (elastic.wait_s); lost 10.78.0.4 (" "$dir/log" ||
      fail "no message naming the lost host"
    grep -q "resume from $dir/out/checkpoints with --resume auto" "$dir/log" || fail "no checkpoint to resume from"
    echo "ok: gave up below --min-ranks"
    ;;
  max_restarts)
    start --max-restarts 0
    at_step
    for p in $(ranks_on 4); do kill -9 "$p"; done
    finish
    [ "$rc" = 1 ] || fail "exit code $rc, expected 1"
    grep -q "gave up: --max-restarts 0 reached" "$dir/log" || fail "no message about the restarts"
    echo "ok: gave up after --max-restarts"
    ;;
  stop)
    start
    at_step
    kill -TERM "$sup"
    finish
    [ "$rc" = 143 ] || fail "exit code $rc, expected 143"
    grep -q "elastic: SIGTERM: asking the job to stop with a checkpoint" "$dir/log" || fail "no stop line"
    grep -q "checkpoint: step [0-9]* (stop signal)" "$dir/log" || fail "no checkpoint at the stop"
    [ "$(report "len(r['elastic']['attempts']), r['elastic']['exit_code']")" = "(1, 143)" ] ||
      fail "report: $(report "r['elastic']")"
    echo "ok: stopped with a checkpoint, no relaunch"
    ;;
  *) echo "unknown scenario '$scenario'"; exit 2 ;;
esac

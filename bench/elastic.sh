#!/usr/bin/env bash
# Benchmark, not a test: batchdist's elastic supervisor against PyTorch's torchrun
# (torch.distributed.run, elastic, Debian's python3-torch 1.13, Gloo, CPU) under the
# same faults on the same four "hosts".
#
# The hosts are network namespaces 10.78.0.1-4 (interface bd0 each) on a bridge br0
# in a fifth namespace (10.78.0.254, the login node), as in
# tests/cluster/elastic_netns.sh, whose setup this copies (names of its own, a mktemp
# directory, everything killed and deleted on exit).
#
#   batchdist  `batchdist elastic configs/quickstart.yaml` on the login node; Open
#              MPI's launch agent starts each host's daemon in its namespace. The
#              job of the elastic test, longer: 40 epochs, G = 96 (24 per rank on
#              4), a checkpoint every 5 steps, Gloo, heartbeat 0.5 s, heartbeat
#              timeout 3 s, 20 ms added to each update
#              (BATCHDIST_FAULT_SLOW_UPDATE_US=20000), and model.batchnorm=false so
#              that the network is the one DDP trains.
#   torchrun   one agent per host namespace (--nnodes=1:4 --nproc_per_node=1
#              --max_restarts=3, c10d rendezvous whose store lives on host 1,
#              GLOO_SOCKET_IFNAME=bd0, LOGLEVEL=INFO so the agents say what they
#              do), each host with a host name of its own (a UTS namespace, and
#              /etc/netns/NS/hosts naming all four) as real hosts have: the agents
#              publish MASTER_ADDR by host name. The script is
#              bench/elastic/ddp_elastic.py: the same MLP without BatchNorm, SGD,
#              24 per process (G = 24 x world: 96 on 4, 72 on 3), a
#              DistributedSampler, the same 20 ms per step, a checkpoint every 5
#              steps (tmp file + os.replace) and a resume from the newest at start
#              (torch elastic's documented pattern), Gloo's default timeout (30
#              min), rank 0 printing one timestamped line per step.
#              --redirects 1 --tee 1 (stdout to a file under the run's directory and
#              to the console): Debian's torch 1.13 on Python 3.11 dies at start
#              with the defaults (-r 0 / -t 0: Std.from_str("0") is None there,
#              "AttributeError: 'NoneType' object has no attribute 'get'").
#
# Faults, injected once a checkpoint of step >= 10 exists (mid-run):
#   kill9      host loss: kill -9 of every process in host 4's namespace (batchdist:
#              orted and the rank; torchrun: the agent and its worker), and host 4
#              starts nothing afterwards (the launch agent fails for it as ssh to a
#              dead host would: batchdist's probes and relaunches; torchrun has no
#              agent left there to restart anything)
#   sigstop    SIGSTOP of host 4's training process(es) (a hang): the batchdist rank,
#              the torchrun worker (its agent keeps running)
#   link_down  `ip -n SWITCH link set p4 down`: host 4 goes silent
# Every output line is stamped with the wall clock as it arrives. Per run:
#   detection s     fault -> batchdist's "lost rank(s)" / "is lost" line; torchrun's
#                   first agent line (hosts 1-3) about the failure or the restart
#   first step W' s fault -> the first step done on the smaller world (batchdist: its
#                   "attempt 2 trains from step" line, printed at the first heartbeat
#                   that reports a step, <= heartbeat_s late; torchrun: rank 0's
#                   first step line at world 3)
#   steps lost      last step done before the fault - the step resumed from
#   G               global batch before -> after
# Every wait is bounded (--bound, 180 s): a fault not recovered by then is reported as
# "> BOUND s (not recovered)" and the run is killed. Runs are interleaved (for each
# fault, for each repeat: batchdist, torchrun); the table shows medians. The raw
# figures and every log stay in the output directory (mktemp, printed at the end).
#
# usage: bash bench/elastic.sh [--repeats N] [--faults kill9,sigstop,link_down]
#                              [--systems batchdist,torchrun] [--bound S]
#                              [--epochs E] [--bin BATCHDIST] [--mpirun MPIRUN]
# Needs root, iproute2 and network namespaces; torchrun needs python3 with torch
# (Debian: apt-get install python3-torch python3-numpy).
set -u

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

usage() {
  sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

repeats=3
faults=kill9,sigstop,link_down
systems=batchdist,torchrun
bound=180
epochs=40
bin=$root/build/launcher/batchdist
mpirun=$(command -v mpirun || echo /usr/bin/mpirun)
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --repeats) repeats=${2:?}; shift 2 ;;
    --faults) faults=${2:?}; shift 2 ;;
    --systems) systems=${2:?}; shift 2 ;;
    --bound) bound=${2:?}; shift 2 ;;
    --epochs) epochs=${2:?}; shift 2 ;;
    --bin) bin=${2:?}; shift 2 ;;
    --mpirun) mpirun=${2:?}; shift 2 ;;
    *) echo "elastic.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
die() { echo "elastic.sh: $*" >&2; exit 1; }
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || die "--repeats wants a positive integer"
[[ "$bound" =~ ^[1-9][0-9]*$ ]] || die "--bound wants a positive integer (seconds)"
[[ "$epochs" =~ ^[1-9][0-9]*$ ]] || die "--epochs wants a positive integer"
IFS=, read -r -a fault_list <<<"$faults"
IFS=, read -r -a system_list <<<"$systems"
for f in "${fault_list[@]}"; do
  case "$f" in kill9 | sigstop | link_down) ;; *) die "unknown fault '$f' (kill9, sigstop, link_down)" ;; esac
done
for s in "${system_list[@]}"; do
  case "$s" in batchdist | torchrun) ;; *) die "unknown system '$s' (batchdist, torchrun)" ;; esac
done

# ---- requirements -------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
command -v ip >/dev/null 2>&1 || die "needs ip (iproute2): apt-get install iproute2"
command -v unshare >/dev/null 2>&1 || die "needs unshare (util-linux)"
# A python3 with torch: Debian's python3-torch lives under /usr/bin/python3 (a pyenv
# or venv python3 earlier in PATH may not see it).
python=
for p in /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
  [ -x "$p" ] && "$p" -c "import torch" 2>/dev/null && { python=$p; break; }
done
if [[ ",$systems," == *,torchrun,* ]]; then
  [ -n "$python" ] || die "torchrun needs python3 with torch: apt-get install python3-torch python3-numpy"
fi
helper_py=$python
[ -n "$helper_py" ] || helper_py=$(command -v python3) || die "needs python3"
if [[ ",$systems," == *,batchdist,* ]]; then
  [ -x "$bin" ] || die "no batchdist binary at $bin (--bin)"
  [ -x "$mpirun" ] || die "no mpirun at $mpirun (--mpirun)"
fi
data=$root/worker/data/digits.csv.gz
cfg=$root/configs/quickstart.yaml
[ -f "$data" ] || die "no digits data at $data"

# ---- hosts --------------------------------------------------------------------------
tag="$$-$RANDOM"
ns() { echo "bdb-$tag-$1"; }
ns_s=$(ns s)
hostname_of() { echo "bdbh$1-$tag"; }
out=$(mktemp -d /tmp/batchdist-bench-elastic.XXXXXX) || die "mktemp"
wdir=$(mktemp -d /tmp/batchdist-bench-elastic-work.XXXXXX) || die "mktemp"

kill_hosts() {  # every process in every namespace: SIGCONT then SIGKILL
  local n pid
  for n in s 1 2 3 4; do
    for pid in $(ip netns pids "$(ns "$n")" 2>/dev/null); do
      kill -CONT "$pid" 2>/dev/null
      kill -9 "$pid" 2>/dev/null
    done
  done
}
cleanup() {
  local n
  kill_hosts
  sleep 0.2
  for n in s 1 2 3 4; do
    ip netns del "$(ns "$n")" 2>/dev/null
    rm -rf "/etc/netns/$(ns "$n")"
  done
  rm -rf "$wdir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

err=$(ip netns add "$ns_s" 2>&1) || die "cannot create a network namespace here ($err); needs CAP_SYS_ADMIN and CAP_NET_ADMIN"
ip -n "$ns_s" link add br0 type bridge || die "bridge"
{ ip -n "$ns_s" addr add 10.78.0.254/24 dev br0 && ip -n "$ns_s" link set br0 up && ip -n "$ns_s" link set lo up; } ||
  die "bridge up"
for h in 1 2 3 4; do
  ip netns add "$(ns "$h")" || die "ip netns add"
  ip link add bd0 netns "$(ns "$h")" type veth peer name "p$h" netns "$ns_s" || die "veth $h"
  { ip -n "$ns_s" link set "p$h" master br0 && ip -n "$ns_s" link set "p$h" up; } || die "port $h"
  ip -n "$(ns "$h")" addr add "10.78.0.$h/24" dev bd0 || die "address $h"
  { ip -n "$(ns "$h")" link set lo up && ip -n "$(ns "$h")" link set bd0 up; } || die "link up $h"
done
# /etc/hosts inside each namespace (ip netns exec bind-mounts /etc/netns/NS/*): the
# machine's own, plus the four host names (used by torchrun only).
for n in s 1 2 3 4; do
  mkdir -p "/etc/netns/$(ns "$n")"
  { cat /etc/hosts; for h in 1 2 3 4; do echo "10.78.0.$h $(hostname_of "$h")"; done; } >"/etc/netns/$(ns "$n")/hosts"
done

cat >"$wdir/agent.sh" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
  10.78.0.[1-4]) ns=bdb-$tag-\${host##*.} ;;
  *) echo "netns agent: no namespace for host '\$host'" >&2; exit 1 ;;
esac
# A dead host (the kill9 fault: host loss) refuses launches, as ssh to it would.
if [ -e "$wdir/dead-\${host##*.}" ]; then echo "ssh: connect to host \$host port 22: No route to host" >&2; exit 255; fi
mkdir -p "$wdir/tmp-\${host##*.}"
exec ip netns exec "\$ns" env OMPI_MCA_orte_tmpdir_base="$wdir/tmp-\${host##*.}" sh -c "\$*"
EOF
chmod +x "$wdir/agent.sh"
for h in 1 2 3 4; do echo "10.78.0.$h slots=1"; done >"$wdir/hosts"

# ---- helpers ------------------------------------------------------------------------
# Prefixes each line with the wall clock (seconds) at which it arrived.
stamp() {
  local line
  while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done
}
now() { echo "$EPOCHREALTIME"; }
elapsed_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b - a}'; }
# wait_until DEADLINE COMMAND...: polls COMMAND every 0.05 s; 1 past the deadline.
wait_until() {
  local deadline=$1; shift
  until "$@"; do
    awk -v d="$deadline" -v n="$EPOCHREALTIME" 'BEGIN{exit !(n < d)}' || return 1
    sleep 0.05
  done
}
deadline_in() { awk -v n="$EPOCHREALTIME" -v s="$1" 'BEGIN{printf "%.3f", n + s}'; }
any_file() { compgen -G "$1" >/dev/null; }
has_line() { grep -qE -- "$2" "$1" 2>/dev/null; }
gone() { ! kill -0 "$1" 2>/dev/null; }

# Returns the hosts to their state before a run: link up, no process left.
reset_hosts() {
  local n
  ip -n "$ns_s" link set p4 up
  rm -f "$wdir/dead-4"
  kill_hosts
  for _ in $(seq 1 100); do
    n=0
    for h in s 1 2 3 4; do n=$((n + $(ip netns pids "$(ns "$h")" 2>/dev/null | wc -l))); done
    [ "$n" = 0 ] && return 0
    sleep 0.1
    kill_hosts
  done
  echo "warning: processes left in the namespaces after a run" >&2
}

# The pids in host H's namespace whose command line matches PATTERN.
pids_matching() {
  local pid
  for pid in $(ip netns pids "$(ns "$1")" 2>/dev/null); do
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE -- "$2" && echo "$pid"
  done
}

# inject SYSTEM FAULT: the fault on host 4; prints what it did.
inject() {
  local pid pids
  case "$2" in
    kill9)
      : >"$wdir/dead-4"  # no launch on host 4 from now on (batchdist's relaunch and probes)
      pids=$(ip netns pids "$(ns 4)")
      for pid in $pids; do kill -9 "$pid" 2>/dev/null; done
      echo "kill -9 of every process in host 4's namespace: ${pids//$'\n'/ }"
      ;;
    sigstop)
      if [ "$1" = batchdist ]; then
        pids=$(for pid in $(ip netns pids "$(ns 4)"); do [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = batchdist ] && echo "$pid"; done)
      else
        pids=$(pids_matching 4 'ddp_elastic\.py' | while read -r pid; do
          tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'torch.distributed.run' || echo "$pid"; done)
      fi
      for pid in $pids; do kill -STOP "$pid"; done
      echo "SIGSTOP of host 4's training process(es): ${pids//$'\n'/ }"
      ;;
    link_down)
      ip -n "$ns_s" link set p4 down
      echo "host 4's bridge port p4 down"
      ;;
  esac
}

job=(--set "train.epochs=$epochs" --set train.threads=1 --set batch.global=96 --set batch.per_gpu=24
     --set checkpoint.every_steps=5 --set checkpoint.keep=1000 --set dist.backend=gloo
     --set dist.timeout_s=30 --set train.progress=off --set model.batchnorm=false
     --set elastic.heartbeat_s=0.5 --set elastic.heartbeat_timeout_s=3 --set elastic.readmit_s=600)
mpi_args="--oversubscribe --bind-to none --allow-run-as-root --mca plm_rsh_agent $wdir/agent.sh"
mpi_args+=" --mca oob_tcp_if_include 10.78.0.0/24 --mca btl_tcp_if_include 10.78.0.0/24 --mca btl self,tcp"
mpi_args+=" -x BATCHDIST_FAULT_SLOW_UPDATE_US"

# run_batchdist FAULT RUNDIR: one run; writes RUNDIR/meta.
run_batchdist() {
  local fault=$1 d=$2 sup t_fault deadline recovered=0
  mkdir -p "$d"
  BATCHDIST_FAULT_SLOW_UPDATE_US=20000 ip netns exec "$ns_s" "$bin" elastic "$cfg" --hosts "$wdir/hosts" \
    --mpirun "$mpirun" --mpirun-args "$mpi_args" --output "$d/out" "${job[@]}" > >(stamp >"$d/log") 2>&1 &
  sup=$!
  disown "$sup"  # no "Killed" job notices; waited for by polling
  deadline=$(deadline_in "$bound")
  if ! wait_until "$deadline" any_file "$d/out/checkpoints/step-0000001[0-9]*"; then
    echo "  no checkpoint past step 10 within $bound s; see $d/log"
    echo "t_fault=" >"$d/meta"
    return
  fi
  t_fault=$(now)
  inject batchdist "$fault" >"$d/fault"
  deadline=$(deadline_in "$bound")
  wait_until "$deadline" has_line "$d/log" "trains from step" && recovered=1
  printf 't_fault=%s\nrecovered=%s\n' "$t_fault" "$recovered" >"$d/meta"
  # Ask it to stop (a checkpoint, elastic.json written), then make sure.
  sleep 1
  kill -TERM "$sup" 2>/dev/null
  wait_until "$(deadline_in 20)" gone "$sup"
}

# run_torchrun FAULT RUNDIR RUN_ID: one run; writes RUNDIR/meta.
run_torchrun() {
  local fault=$1 d=$2 id=$3 h conf t_fault deadline recovered=0
  mkdir -p "$d/ckpt"
  for h in 1 2 3 4; do
    conf=is_host=0
    [ "$h" = 1 ] && conf=is_host=1
    # shellcheck disable=SC2016 # $0 and $@ are the inner shell's
    ip netns exec "$(ns "$h")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$(hostname_of "$h")" \
      env GLOO_SOCKET_IFNAME=bd0 LOGLEVEL=INFO OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 \
      "$python" -m torch.distributed.run --nnodes=1:4 --nproc_per_node=1 --max_restarts=3 \
      --rdzv_backend=c10d --rdzv_endpoint=10.78.0.1:29400 --rdzv_id="bench-$id" --rdzv_conf="$conf" \
      --redirects 1 --tee 1 --log_dir "$d/torchelastic" \
      "$here/elastic/ddp_elastic.py" --data "$data" --ckpt-dir "$d/ckpt" --epochs "$epochs" \
      --batch 24 --every 5 --sleep-ms 20 > >(stamp >"$d/host$h.log") 2>&1 &
    disown "$!"
  done
  deadline=$(deadline_in "$bound")
  if ! wait_until "$deadline" any_file "$d/ckpt/step-0000001[0-9].pt"; then
    echo "  no checkpoint past step 10 within $bound s; see $d/host*.log"
    echo "t_fault=" >"$d/meta"
    reset_hosts
    return
  fi
  t_fault=$(now)
  inject torchrun "$fault" >"$d/fault"
  deadline=$(deadline_in "$bound")
  wait_until "$deadline" has_line_any "$d" 'STEP [0-9.]+ step=[0-9]+ world=[1-3] ' && recovered=1
  printf 't_fault=%s\nrecovered=%s\n' "$t_fault" "$recovered" >"$d/meta"
  sleep 1
}
has_line_any() { cat "$1"/host*.log 2>/dev/null | grep -qE -- "$2"; }

# ---- the runs -----------------------------------------------------------------------
echo "uptime: $(uptime)"
echo "output: $out"
echo "batchdist: $bin; mpirun: $mpirun"
[ -n "$python" ] && echo "torch: $("$python" -c 'import torch; print(torch.__version__)') ($python)"
echo "faults: ${fault_list[*]}; systems: ${system_list[*]}; repeats: $repeats; bound: $bound s; epochs: $epochs"
run=0
for fault in "${fault_list[@]}"; do
  for rep in $(seq 1 "$repeats"); do
    for system in "${system_list[@]}"; do
      run=$((run + 1))
      d="$out/runs/$(printf '%02d' "$run")-$fault-$system-$rep"
      reset_hosts
      t0=$(now)
      echo "run $run: $fault, $system, repeat $rep ..."
      if [ "$system" = batchdist ]; then run_batchdist "$fault" "$d"; else run_torchrun "$fault" "$d" "$run"; fi
      reset_hosts
      "$helper_py" "$here/elastic/figures.py" record --system "$system" --fault "$fault" --repeat "$rep" \
        --dir "$d" --bound "$bound" >>"$out/runs.jsonl" || echo "  (no figures for this run)"
      # The checkpoints are not needed any more (the logs and elastic.json stay).
      rm -rf "$d/out/checkpoints" "$d/ckpt"
      echo "  $(tail -n 1 "$out/runs.jsonl" | "$helper_py" "$here/elastic/figures.py" brief) [$(elapsed_since "$t0") s]"
    done
  done
done

echo
echo "uptime: $(uptime)"
"$helper_py" "$here/elastic/figures.py" table --runs "$out/runs.jsonl" --bound "$bound" --json "$out/results.json"
echo
echo "raw figures: $out/results.json (per run: $out/runs.jsonl); logs: $out/runs/"

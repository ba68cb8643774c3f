#!/usr/bin/env bash
# A throwaway one-node Slurm cluster for the tests, sourced by slurm_test.sh:
# munged, slurmctld and slurmd started directly (no systemd), every file under
# $SLURM_TEST_DIR, every daemon on its own socket/ports, so nothing on the host
# is touched. slurm_cluster_start defines SLURM_CONF for the client commands;
# slurm_cluster_stop ends the daemons it started (by pid) and is trap-safe.

# A TCP port nothing listens on (ss from iproute2), from a range the kernel does
# not hand out as ephemeral ports by default, and none of the ports given (taken
# already, by a daemon not listening yet).
slurm_free_port() {
  local port
  for _ in $(seq 1 50); do
    port=$((20000 + RANDOM % 12000))
    case " $* " in *" $port "*) continue ;; esac
    if ! ss -Htln 2>/dev/null | awk '{print $4}' | grep -q ":$port\$"; then
      echo "$port"
      return 0
    fi
  done
  echo "$port"
}

slurm_cluster_stop() {
  local pid
  # Jobs first, so their slurmstepd and tasks end through Slurm.
  if [ -n "${SLURM_CONF:-}" ] && [ -n "${SLURM_TEST_PIDS:-}" ]; then
    local jobs
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      timeout 10 scancel $jobs 2>/dev/null
      for _ in $(seq 1 60); do
        [ -z "$(timeout 10 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.25
      done
    fi
  fi
  for pid in ${SLURM_TEST_PIDS:-}; do kill "$pid" 2>/dev/null; done
  for _ in $(seq 1 50); do
    local alive=""
    for pid in ${SLURM_TEST_PIDS:-}; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  for pid in ${SLURM_TEST_PIDS:-}; do kill -9 "$pid" 2>/dev/null; done
  SLURM_TEST_PIDS=""
  # A step daemon (slurmstepd) still finishing outlives slurmd and ignores SIGTERM;
  # ours are the processes holding files of this cluster's directory open.
  if [ -n "${SLURM_TEST_DIR:-}" ]; then
    for pid in $(find /proc/[0-9]*/fd -maxdepth 1 -lname "$SLURM_TEST_DIR/*" 2>/dev/null |
      cut -d/ -f3 | sort -u); do
      [ "$pid" != "$$" ] && [ "$pid" != "$BASHPID" ] && kill -9 "$pid" 2>/dev/null
    done
  fi
}

# usage: slurm_cluster_start DIR CPUS
slurm_cluster_start() {
  local dir=$1 cpus=${2:-2}
  SLURM_TEST_DIR=$dir
  SLURM_TEST_PIDS=""
  mkdir -p "$dir"/{munge,state,spool,log,run,tmp}
  chmod 700 "$dir/munge"
  local host; host=$(hostname -s)
  mungekey -c -k "$dir/munge/munge.key" || return 1
  munged -F -f -S "$dir/run/munge.sock" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/log/munged.log" --pid-file="$dir/run/munged.pid" \
    --seed-file="$dir/munge/seed" >"$dir/log/munged.out" 2>&1 &
  SLURM_TEST_PIDS="$SLURM_TEST_PIDS $!"
  for _ in $(seq 1 50); do [ -S "$dir/run/munge.sock" ] && break; sleep 0.1; done
  if ! timeout 10 munge -S "$dir/run/munge.sock" -n >/dev/null; then
    echo "slurm_cluster_start: munged did not start:" >&2
    cat "$dir/log/munged.out" "$dir/log/munged.log" >&2
    return 1
  fi
  local ctl_port; ctl_port=$(slurm_free_port)
  local d_port; d_port=$(slurm_free_port "$ctl_port")
  cat >"$dir/slurm.conf" <<CONF
ClusterName=batchdist-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/run/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
TmpFS=$dir/tmp
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=300
SlurmdTimeout=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -D -i -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1 &
  SLURM_TEST_PIDS="$SLURM_TEST_PIDS $!"
  slurmd -D -f "$SLURM_CONF" -N "$host" >"$dir/log/slurmd.out" 2>&1 &
  SLURM_TEST_PIDS="$SLURM_TEST_PIDS $!"
  # Ready when the node is idle (bounded: 30 s).
  for _ in $(seq 1 100); do
    if [ "$(timeout 5 sinfo -h -N -o %t 2>/dev/null)" = "idle" ]; then return 0; fi
    sleep 0.3
  done
  echo "slurm_cluster_start: the node did not become idle within 30 s" >&2
  timeout 5 sinfo -N -l >&2
  tail -n 20 "$dir"/log/*.log "$dir"/log/*.out >&2
  return 1
}

#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair, each
# with its own address on a private subnet that exists only between them
# (10.77.0.1/24 and 10.77.0.2/24, interface bd0 in both; no other interface but lo).
# mpirun runs in namespace A with a hostfile naming both addresses; its launch
# agent (instead of ssh) starts Open MPI's daemon for 10.77.0.2 inside namespace
# B, so rank 0 runs in A and rank 1 in B, and Open MPI's own TCP is held to bd0.
#
# usage: netns_test.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG SCENARIO
#   train          no interface named: rank 0 picks bd0 by itself; report hosts 2
#   train_ifname   BATCHDIST_IFNAME=bd0 on every rank
#   wrong_lo       dist.interface=lo: rank 1 cannot reach 127.0.0.1 of host A;
#                  a clear error within dist.timeout_s (10 s), not a hang
#   wrong_missing  dist.interface=nope0: a clear error naming the interfaces, exit 2
# Exit 77 (ctest SKIP_RETURN_CODE) with the reason when namespaces cannot be made
# here (not root, or a container without CAP_SYS_ADMIN/CAP_NET_ADMIN).
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 scenario=$5

command -v ip >/dev/null 2>&1 || { echo "SKIP: ip (iproute2) is not installed: apt-get install iproute2"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }

# Names of this run's own (pid and a random part): a namespace that a killed run
# left behind under the same pid would make `ip netns add` fail, read as a SKIP.
tag="$$-$RANDOM"
ns_a="batchdist-$tag-a" ns_b="batchdist-$tag-b"
dir=$(mktemp -d /tmp/batchdist-netns.XXXXXX)
cleanup() {
  local ns pid
  for ns in "$ns_a" "$ns_b"; do
    # Anything still running in our namespaces was started by this test.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if ! err=$(ip netns add "$ns_a" 2>&1); then
  echo "SKIP: cannot create a network namespace here ($err); this test needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN"
  exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
ip netns add "$ns_b" || fail "ip netns add $ns_b"
# Both ends are created inside the namespaces: nothing appears in the host's namespace.
ip link add bd0 netns "$ns_a" type veth peer name bd0 netns "$ns_b" || fail "ip link add veth"
ip -n "$ns_a" addr add 10.77.0.1/24 dev bd0 || fail "address A"
ip -n "$ns_b" addr add 10.77.0.2/24 dev bd0 || fail "address B"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up && ip -n "$ns" link set bd0 up || fail "link up in $ns"
done
echo "host A = namespace $ns_a: $(ip -n "$ns_a" -o -4 addr show bd0 | awk '{print $2, $4}')"
echo "host B = namespace $ns_b: $(ip -n "$ns_b" -o -4 addr show bd0 | awk '{print $2, $4}')"

# The launch agent Open MPI calls as `agent HOST COMMAND...` instead of ssh.
cat >"$dir/agent.sh" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
  10.77.0.1) ns=$ns_a ;;
  10.77.0.2) ns=$ns_b ;;
  *) echo "netns agent: no namespace for host '\$host'" >&2; exit 1 ;;
esac
echo "\$host -> \$ns: \$*" >>"$dir/agent.log"
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$dir/agent.sh"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' >"$dir/hosts"

tx_bytes() { ip -n "$ns_a" -s -j link show bd0 2>/dev/null | grep -o '"tx":{"bytes":[0-9]*' | grep -o '[0-9]*$'; }

# Runs batchdist on the two hosts with extra mpirun options $mpi_extra and batchdist
# arguments "$@"; stdout+stderr in $dir/log, exit code in $rc, seconds in $secs.
mpi_extra=""
run_job() {
  local start end
  start=$(date +%s%N)
  # shellcheck disable=SC2086
  timeout 120 ip netns exec "$ns_a" "$mpirun" $flags -np 2 --hostfile "$dir/hosts" \
    --mca plm_rsh_agent "$dir/agent.sh" --mca oob_tcp_if_include bd0 \
    --mca btl_tcp_if_include bd0 --mca btl self,tcp $mpi_extra \
    "$bin" "$cfg" --output "$dir/out" --set train.epochs=3 --set train.threads=1 "$@" \
    >"$dir/log" 2>&1
  rc=$?
  end=$(date +%s%N)
  secs=$(( (end - start) / 1000000000 ))
  grep -v '^epoch .* step' "$dir/log" | tail -n 25
  echo "exit code $rc after ${secs} s"
  [ "$rc" != 124 ] || fail "the job hung: killed after 120 s"
}

check_trained() {
  local tx0=$1 tx1
  tx1=$(tx_bytes)
  [ "$rc" = 0 ] || fail "training across the namespaces failed"
  grep -q '"world_size": 2,' "$dir/out/report.json" || fail "report: world_size is not 2"
  grep -q '"completed": true' "$dir/out/report.json" || fail "report: not completed"
  # Hosts come from MPI_COMM_TYPE_SHARED: Open MPI counts its daemons' nodes, so
  # the two namespaces are two hosts even on one kernel.
  grep -q '"hosts": 2,' "$dir/out/report.json" || fail "report: hosts is not 2"
  grep -q '2 rank(s) on 2 host(s)' "$dir/log" || fail "log: not '2 rank(s) on 2 host(s)'"
  # The store lives on host A's veth address, and rank 1 really ran in namespace B.
  grep -q 'store 10\.77\.0\.1:[0-9]' "$dir/log" || fail "log: the store is not on 10.77.0.1"
  grep -q "^10.77.0.2 -> $ns_b: .*orted" "$dir/agent.log" || fail "no Open MPI daemon started in $ns_b"
  # Gradients crossed the veth: 66 steps x ~70 KB of gradients, both ways.
  [ -n "$tx0" ] && [ -n "$tx1" ] || fail "cannot read bd0's byte counters"
  [ $((tx1 - tx0)) -gt 1000000 ] || fail "only $((tx1 - tx0)) bytes left host A over bd0"
  echo "ok: world_size 2, hosts 2, store $(grep -o 'store 10\.77\.0\.1:[0-9]*' "$dir/log" | cut -d' ' -f2), $(( (tx1 - tx0) / 1000 )) kB sent by A over bd0, eval_accuracy $(grep -o '"eval_accuracy": [0-9.]*' "$dir/out/report.json" | tail -1 | cut -d' ' -f2)"
}

case "$scenario" in
  train)
    tx0=$(tx_bytes)
    run_job
    check_trained "$tx0"
    ;;
  train_ifname)
    tx0=$(tx_bytes)
    export BATCHDIST_IFNAME=bd0
    mpi_extra="-x BATCHDIST_IFNAME"
    run_job
    check_trained "$tx0"
    ;;
  wrong_lo)
    run_job --set dist.interface=lo --set dist.timeout_s=10
    [ "$rc" != 0 ] || fail "training succeeded although rank 0's store was on loopback"
    grep -q 'rank 1 could not reach the rendezvous store of rank 0 at 127.0.0.1:[0-9]* within 10 s' "$dir/log" ||
      fail "no error naming the unreachable store"
    grep -q 'pick an interface both hosts share' "$dir/log" || fail "the error does not say what to do"
    [ "$secs" -le 60 ] || fail "the error took ${secs} s with dist.timeout_s=10"
    [ ! -e "$dir/out/report.json" ] || fail "a report was written"
    echo "ok: unreachable store reported in ${secs} s"
    ;;
  wrong_missing)
    run_job --set dist.interface=nope0 --set dist.timeout_s=10
    [ "$rc" = 2 ] || fail "exit code $rc, expected 2 (bad input)"
    grep -q "dist.interface: no interface 'nope0' with an IPv4 address on this host; it has: lo (127.0.0.1), bd0 (10.77.0." "$dir/log" ||
      fail "no error naming the missing interface and the ones there are"
    [ "$secs" -le 30 ] || fail "the error took ${secs} s"
    echo "ok: missing interface reported in ${secs} s"
    ;;
  *)
    echo "unknown scenario '$scenario'"
    exit 2
    ;;
esac

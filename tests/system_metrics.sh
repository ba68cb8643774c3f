#!/usr/bin/env bash
# Note [system metrics] in real runs, NVML read from the stub library
# (tests/nvml_stub.cc) through BATCHDIST_NVML_LIBRARY on CPU ranks.
# usage: system_metrics.sh MPIRUN "MPI FLAGS" BATCHDIST CONFIG OUTDIR STUB PARTIAL_STUB SCENARIO
#   stub      2 ranks, two loader threads each; the stub's temperature fails and
#             it reports a power cap: every rank says it could not read the
#             temperature and goes on; report.json has both ranks' series and
#             summaries (GPU 42 %, power-capped in every sample, the CPU and the
#             loader), metrics.jsonl and TensorBoard rank 0's, and the diagnosis
#             the throttling, the idle GPU and the memory headroom
#   partial   a library without the power entry points: said, the rest read
#   nodevice  the device cannot be opened: said; the CPU is still sampled
#   off       report.sample_s 0: no sampler, no "system" anywhere
#   invalid   report.sample_s 0.001: a configuration error naming the key
set -u
mpirun=$1 flags=$2 bin=$3 cfg=$4 out=$5 stub=$6 partial=$7 scenario=$8
. "$(dirname "$0")/mpi_job_lib.sh"
own_scratch_out
# Long enough for a few samples at 0.02 s on any machine (more on a slow one).
common=(--set train.threads=1 --set train.progress=off --set train.max_steps=1500
        --set train.epochs=1000 --set report.sample_s=0.02)

# check RUN PYTHON: asserts on report.json (r), metrics.jsonl's lines (m) and the log (log).
check() {
  python3 - "$out/$1" "$out/$1.log" <<EOF_PY || exit 1
import json, sys, glob
run, log = sys.argv[1], open(sys.argv[2]).read()
r = json.load(open(run + "/report.json"))
m = [json.loads(l) for l in open(run + "/metrics.jsonl")]
$2
EOF_PY
}

case "$scenario" in
  stub)
    BATCHDIST_NVML_LIBRARY=$stub BATCHDIST_NVML_STUB_FAIL=temperature BATCHDIST_NVML_STUB_REASONS=0x4 \
      run_into run 2 "${common[@]}" --set data.workers=2
    [ "$rc" = 0 ] || { cat "$out/run.log"; fail "exit $rc"; }
    for r in 0 1; do
      grep -qF "rank $r: system metrics: warning: could not read the GPU's temperature (Unknown Error (999)); it is left out while it fails, the run goes on" \
        "$out/run.log" || { cat "$out/run.log"; fail "rank $r does not say the temperature failed"; }
    done
    check run '
ranks = r["system"]["ranks"]
assert [x["rank"] for x in ranks] == [0, 1], ranks
for x in ranks:
    run_ = x["run"]
    assert run_["samples"] >= 3, x
    assert run_["gpu_util_pct"] == 42 and run_["gpu_memory_util_pct"] == 17, run_
    assert run_["gpu_memory_used_mb"] == 20480 and run_["gpu_power_w"] == 350, run_
    assert run_["gpu_power_throttled"] == 1 and run_["gpu_thermal_throttled"] == 0, run_
    assert "gpu_temperature_c" not in run_, run_
    assert 0 < run_["cpu_process_pct"] and 0 < run_["cpu_host_pct"] <= 100, run_
    assert 0 <= run_["loader_busy"] <= 1, run_
    assert any(u.startswith("GPU temperature: ") for u in x["unread"]), x["unread"]
    assert x["series"] and all(p["samples"] > 0 and p["gpu_util_pct"] == 42 for p in x["series"]), x["series"][:2]
    steps = [p["step"] for p in x["series"]]
    assert steps == sorted(steps), steps
points = [l for l in m if l["kind"] == "step" and "gpu_util_pct" in l]
assert points and all(l["gpu_power_throttled"] == 1 for l in points), m[:3]
assert not any("gpu_temperature_c" in l for l in m)
events = b"".join(open(f, "rb").read() for f in glob.glob(run + "/tensorboard/train/events.out.tfevents.*"))
for tag in (b"system/gpu_util_pct", b"system/cpu_process_pct", b"system/loader_busy"):
    assert tag in events, tag
page = open(run + "/report.html").read()
for chart in ("gpu", "gpu-memory", "power", "cpu", "loader"):
    assert "id=\x22plot-system-%s-%s\x22" % (chart, ranks[0]["host"]) in page, chart
assert "plot-system-temperature" not in page  # never read
assert "system (the 2 ranks\x27 mean; memory and temperature: the highest): GPU busy 42 %" in log, log
d = r["diagnosis"]
assert any(s.startswith("throttling: rank 0 on ") and "power-capped in 100 % of samples (350 W of 700 W)" in s for s in d), d
assert any(s.startswith("utilization: the GPU was busy 42 % of the time (NVML, rank ") for s in d), d
assert any(s.startswith("memory: at most 20.0 GiB of 80.0 GiB in use (25 %, NVML") for s in d), d
print("ok: 2 ranks, %d and %d samples; GPU 42 %%, power-capped, temperature said and left out; "
      "loader busy %.2f, process CPU %.0f %%" % (ranks[0]["run"]["samples"], ranks[1]["run"]["samples"],
      ranks[0]["run"]["loader_busy"], ranks[0]["run"]["cpu_process_pct"]))'
    ;;
  partial)
    BATCHDIST_NVML_LIBRARY=$partial run_into run 1 "${common[@]}"
    [ "$rc" = 0 ] || { cat "$out/run.log"; fail "exit $rc"; }
    grep -qF "rank 0: system metrics: warning: NVML cannot read power (no nvmlDeviceGetPowerUsage), power limit (no nvmlDeviceGetEnforcedPowerLimit), throttle reasons (no nvmlDeviceGetCurrentClocksThrottleReasons); the other GPU metrics are sampled" \
      "$out/run.log" || { cat "$out/run.log"; fail "the missing entry points are not said"; }
    check run '
x = r["system"]["ranks"][0]
assert x["run"]["gpu_util_pct"] == 42 and x["run"]["gpu_temperature_c"] == 71, x["run"]
assert "gpu_power_w" not in x["run"] and "gpu_power_throttled" not in x["run"], x["run"]
assert "GPU power (no nvmlDeviceGetPowerUsage)" in x["unread"], x["unread"]
print("ok: without the power entry points the rest is read:", x["unread"])'
    ;;
  nodevice)
    BATCHDIST_NVML_LIBRARY=$stub BATCHDIST_NVML_STUB_FAIL=device run_into run 1 "${common[@]}"
    [ "$rc" = 0 ] || { cat "$out/run.log"; fail "exit $rc"; }
    grep -qF "rank 0: system metrics: warning: no GPU metrics: nvmlDeviceGetHandleByIndex_v2(0): Unknown Error (999)" \
      "$out/run.log" || { cat "$out/run.log"; fail "the device error is not said"; }
    check run '
x = r["system"]["ranks"][0]
assert x["unread"] == ["GPU: nvmlDeviceGetHandleByIndex_v2(0): Unknown Error (999)"], x["unread"]
assert "gpu_util_pct" not in x["run"] and x["run"]["cpu_process_pct"] > 0, x["run"]
print("ok: no device: said; the CPU sampled")'
    ;;
  off)
    run_into run 1 "${common[@]}" --set report.sample_s=0
    [ "$rc" = 0 ] || { cat "$out/run.log"; fail "exit $rc"; }
    check run '
assert "system" not in r, r["system"]
assert not any("cpu_process_pct" in l for l in m)
print("ok: report.sample_s 0: no system metrics")'
    ;;
  invalid)
    run_into run 1 "${common[@]}" --set report.sample_s=0.001
    expect_error run 2 "--set report.sample_s: 0.001 s is too short a sampling period: 0 (off) or at least 0.01"
    ;;
  *) fail "unknown scenario $scenario" ;;
esac

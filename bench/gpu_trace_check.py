#!/usr/bin/env python3
"""What a GPU run's profiler trace and system metrics hold (bench/gpu_acceptance.sh's
trace step): that the trace (Note [step profiler]) has the GPU's kernels and NCCL's
work, and that NVML's metrics (Note [system metrics], metrics.jsonl) are not zero.

usage: gpu_trace_check.py RUN [--world W] [--out FILE.json]
RUN: a batchdist run's output directory with profile/*_rank0.pt.trace.json (a
Kineto trace, profile.active steps) and metrics.jsonl. Prints one line and, with
--out, writes the figures as JSON:
  kernels          the trace's GPU kernel events (cat "kernel") and the most
                   frequent names
  nccl_kernels     kernel events whose name has "nccl" (any case); nccl_events
                   the other events that do (c10d's host-side records, annotations)
  nccl_note        why there are none: with one rank NCCL may launch no kernel
                   (nothing to reduce across one GPU), which is no failure
  nvml             per metric of metrics.jsonl's step points, the largest value
                   (report.json's system figures where metrics.jsonl has none)
Exit 1 (the problems listed) when the trace has no kernel, when W > 1 and no NCCL
kernel ran, or when the GPU's utilisation, memory in use or power is zero or
missing from the metrics.
"""
import collections
import glob
import json
import os
import sys

NVML = ["gpu_util_pct", "gpu_memory_util_pct", "gpu_memory_used_mb", "gpu_memory_total_mb", "gpu_power_w",
        "gpu_sm_clock_mhz", "gpu_temperature_c"]
MUST = ["gpu_util_pct", "gpu_memory_used_mb", "gpu_power_w"]  # nonzero while a GPU trains


def trace_figures(run, world, out):
    files = sorted(glob.glob(os.path.join(run, "profile", "*_rank0.pt.trace.json")))
    if not files:
        out["problems"].append(f"no profile/*_rank0.pt.trace.json in {run}")
        return
    out["trace"] = files[0]
    try:
        events = json.load(open(files[0])).get("traceEvents", [])
    except (OSError, ValueError) as e:
        out["problems"].append(f"{files[0]}: not a trace: {e}")
        return
    kernels = [e for e in events if e.get("cat") == "kernel"]
    nccl_k = [e for e in kernels if "nccl" in str(e.get("name", "")).lower()]
    nccl_other = [e for e in events if e.get("cat") != "kernel" and "nccl" in str(e.get("name", "")).lower()]
    out.update({
        "events": len(events),
        "steps": sorted(int(e["name"].split("#")[1]) for e in events
                        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
        "kernels": len(kernels),
        "kernel_names": [n for n, _ in collections.Counter(e.get("name", "") for e in kernels).most_common(5)],
        "memcpy": sum(1 for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")),
        "nccl_kernels": len(nccl_k),
        "nccl_kernel_names": sorted({e.get("name", "") for e in nccl_k})[:5],
        "nccl_events": len(nccl_other),
        "nccl_event_names": sorted({str(e.get("name", "")) for e in nccl_other})[:5],
    })
    if not kernels:
        out["problems"].append("no GPU kernel events in the trace (Kineto recorded no CUDA activity)")
    if not nccl_k:
        if world == 1:
            out["nccl_note"] = ("1 GPU: no NCCL kernel in the traced steps (nothing to reduce across one rank)"
                                + (f"; {len(nccl_other)} NCCL host-side event(s)" if nccl_other else ""))
        else:
            out["problems"].append(f"no NCCL kernel in the traced steps on {world} GPUs")


def nvml_figures(run, out):
    points = []
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if any(k in j for k in NVML):
                    points.append(j)
    except OSError:
        pass
    nvml, source = {}, "metrics.jsonl"
    for k in NVML:
        vals = [p[k] for p in points if isinstance(p.get(k), (int, float))]
        if vals:
            nvml[k] = max(vals)
    if not points:  # report.json's run summary, every rank's
        source = "report.json"
        try:
            ranks = (json.load(open(os.path.join(run, "report.json"))).get("system") or {}).get("ranks", [])
        except (OSError, ValueError):
            ranks = []
        for k in NVML:
            vals = [(r.get("run") or {}).get(k) for r in ranks]
            vals = [v for v in vals if isinstance(v, (int, float))]
            if vals:
                nvml[k] = max(vals)
        if not nvml:
            source = None
    out.update({"nvml": nvml, "nvml_points": len(points), "nvml_source": source})
    missing = [k for k in MUST if k not in nvml]
    zero = [k for k in MUST if k in nvml and not nvml[k] > 0]
    if not nvml:
        out["problems"].append("no NVML metrics in metrics.jsonl or report.json")
    elif missing or zero:
        out["problems"].append("NVML metrics " + ", ".join(
            [f"{k} missing" for k in missing] + [f"{k} zero" for k in zero]))
    out["nvml_nonzero"] = bool(nvml) and not missing and not zero


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if args else 2)
    run, world, dest = args[0], 1, None
    rest = args[1:]
    while rest:
        if rest[0] == "--world" and len(rest) > 1:
            world, rest = int(rest[1]), rest[2:]
        elif rest[0] == "--out" and len(rest) > 1:
            dest, rest = rest[1], rest[2:]
        else:
            sys.exit(f"gpu_trace_check.py: unknown argument {rest[0]!r}")
    out = {"run": run, "world": world, "problems": [], "nccl_note": None}
    trace_figures(run, world, out)
    nvml_figures(run, out)
    if dest:
        with open(dest, "w") as f:
            json.dump(out, f, indent=2)
    n = out.get("nvml", {})
    print(f"trace: {out.get('kernels', 0)} kernel events, {out.get('nccl_kernels', 0)} NCCL kernel(s), "
          f"{out.get('nccl_events', 0)} NCCL host event(s){'; ' + out['nccl_note'] if out['nccl_note'] else ''}; "
          f"NVML ({out['nvml_points']} points): GPU {n.get('gpu_util_pct')} %, {n.get('gpu_memory_used_mb')} MB, "
          f"{n.get('gpu_power_w')} W")
    for p in out["problems"]:
        print("FAIL: " + p)
    sys.exit(1 if out["problems"] else 0)


main()

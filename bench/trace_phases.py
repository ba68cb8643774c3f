#!/usr/bin/env python3
"""Where a traced step's time goes: the share of each of batchdist's phases in a
profiler trace (Note [step profiler], Note [trace ranges]).

usage: trace_phases.py [--json] TRACE_OR_DIR
TRACE_OR_DIR: a rank's .pt.trace.json, or a directory of them (OUTPUT/profile:
rank 0's is read). For each ProfilerStep#N range: the wall time each phase
(batchdist/data_wait, host_to_device, forward, backward, gradient_sync,
optimizer) covers inside it, as a share of the step (a phase that runs several
times, as forward and backward do under accumulation, counts once per moment:
the union of its ranges), and "other" (the step covered by none of them). On a
trace with device activity (Kineto on CUDA): the share of the step some kernel
ran ("gpu_busy"), an NCCL kernel ran ("gpu_nccl") and a memcpy ran
("gpu_memcpy"). Medians over the traced steps; --json prints them as JSON.
"""
import glob
import json
import os
import statistics
import sys

PHASES = ["data_wait", "host_to_device", "forward", "backward", "gradient_sync", "optimizer"]


def union(intervals, lo, hi):
    """Length of the union of `intervals` clipped to [lo, hi]."""
    spans = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, end = 0.0, lo
    for a, b in spans:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def pick(path):
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*_rank0.pt.trace.json")))
        if not files:
            sys.exit(f"trace_phases.py: no *_rank0.pt.trace.json in {path}")
        return files[0]
    return path


def phases(path):
    events = json.load(open(path))["traceEvents"]
    ranges = [e for e in events if e.get("ph") == "X" and "dur" in e]
    span = lambda e: (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
    steps = sorted((e for e in ranges if e["name"].startswith("ProfilerStep#")), key=lambda e: float(e["ts"]))
    if not steps:
        sys.exit(f"trace_phases.py: no ProfilerStep range in {path}")
    ours = {p: [span(e) for e in ranges if e["name"] == "batchdist/" + p] for p in PHASES}
    kernels = [span(e) for e in ranges if e.get("cat") == "kernel"]
    nccl = [span(e) for e in ranges if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]
    memcpy = [span(e) for e in ranges if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    rows = []
    for s in steps:
        lo, hi = span(s)
        length = max(hi - lo, 1e-9)
        row = {"step": int(s["name"].split("#")[1]), "ms": length / 1000}
        for p in PHASES:
            row[p] = union(ours[p], lo, hi) / length
        row["other"] = 1 - union([x for p in PHASES for x in ours[p]], lo, hi) / length
        if kernels:
            row["gpu_busy"] = union(kernels, lo, hi) / length
            row["gpu_nccl"] = union(nccl, lo, hi) / length
            row["gpu_memcpy"] = union(memcpy, lo, hi) / length
        rows.append(row)
    keys = [k for k in rows[0] if k != "step"]
    median = {k: statistics.median(r[k] for r in rows) for k in keys}
    return {"file": path, "steps": [r["step"] for r in rows], "median": median, "per_step": rows}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1 or "-h" in sys.argv or "--help" in sys.argv:
        print(__doc__)
        sys.exit(0 if "--help" in sys.argv or "-h" in sys.argv else 2)
    result = phases(pick(args[0]))
    if "--json" in sys.argv:
        print(json.dumps(result, indent=2))
        return
    m = result["median"]
    print(f"{result['file']}: steps {result['steps']}, median step {m['ms']:.2f} ms")
    for k in PHASES + ["other"] + [k for k in ("gpu_busy", "gpu_nccl", "gpu_memcpy") if k in m]:
        print(f"  {k:15} {100 * m[k]:5.1f} %")


main()

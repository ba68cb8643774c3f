"""Checks the profiler traces of a batchdist run (Note [step profiler]).

usage: profile_check.py OUTPUT WORLD STEP... [--no-buckets | --buckets=N]
                        [--dir=SUBDIR] [--one-step] [--no-report]
Each rank's OUTPUT/profile/<host>_rank<R>.pt.trace.json must be a Chrome trace
with one "ProfilerStep#N" range per traced step N (exactly STEP...), each
holding batchdist's phases, and no batchdist range outside them.
--dir: the traces are in OUTPUT/SUBDIR instead (a search candidate's:
profile/search/per_gpu_16); --one-step: exactly one step, whichever it is (no
STEP given); --no-report: report.json's profile is not checked (the search's
traces are not the run's).
"""
import glob
import json
import os
import sys

PHASES = ["batchdist/data_wait", "batchdist/forward", "batchdist/backward",
          "batchdist/gradient_sync", "batchdist/optimizer"]
SLACK_US = 2  # Kineto rounds nanoseconds to microseconds


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check_nesting(path, ranges):
    """Ranges on one thread nest (what TensorBoard's plugin and Perfetto require)."""
    by_thread = {}
    for e in ranges:
        by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, es in by_thread.items():
        es.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        open_ends = []
        for e in es:
            a, b = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            while open_ends and open_ends[-1][0] <= a:
                open_ends.pop()
            if open_ends and b > open_ends[-1][0] + 0.01:
                fail(f"{path}: {e['name']} ({a}..{b}) overlaps {open_ends[-1][1]} "
                     f"(ends {open_ends[-1][0]}) on thread {key} without nesting")
            open_ends.append((b, e["name"]))


def check_rank(path, rank, world, steps, buckets):
    try:
        trace = json.load(open(path))
    except ValueError as e:
        fail(f"{path}: not JSON: {e}")
    events = trace.get("traceEvents")
    if not isinstance(events, list) or not events:
        fail(f"{path}: no traceEvents list")
    for e in events:
        if e.get("ph") not in ("X", "i", "I", "M", "f", "s", "t", "C", "B", "E", "b", "e"):
            fail(f"{path}: an event with phase {e.get('ph')!r}: {e}")
        if e.get("ph") == "X" and not all(k in e for k in ("name", "pid", "tid", "ts", "dur")):
            fail(f"{path}: a complete event without name/pid/tid/ts/dur: {e}")
    info = trace.get("distributedInfo", {})
    if info.get("rank") != rank or info.get("world_size") != world:
        fail(f"{path}: distributedInfo {info}, expected rank {rank} of {world}")
    ranges = [e for e in events if e.get("ph") == "X"]
    check_nesting(path, ranges)
    # Gradient buckets' collectives: async begin/end pairs (Note [trace ranges]).
    begins = {e["id"]: e for e in events if e.get("ph") == "b"}
    ends = {e["id"]: e for e in events if e.get("ph") == "e"}
    if set(begins) != set(ends):
        fail(f"{path}: async begins {sorted(begins)} and ends {sorted(ends)} do not pair")
    for i, b in begins.items():
        if float(ends[i]["ts"]) < float(b["ts"]):
            fail(f"{path}: {b['name']} ends before it begins")
        ranges.append({"name": b["name"], "ts": b["ts"], "dur": float(ends[i]["ts"]) - float(b["ts"]),
                       "cat": "async"})
    step_ranges = [e for e in ranges if e["name"].startswith("ProfilerStep#")]
    got = sorted(int(e["name"].split("#")[1]) for e in step_ranges)
    if steps is None and len(got) == 1:
        steps = got  # --one-step
    if got != steps:
        fail(f"{path}: ProfilerStep ranges for steps {got}, expected {steps}")
    ops = [e for e in ranges if e.get("cat") == "cpu_op"]
    if not ops:
        fail(f"{path}: no operator (cpu_op) events")
    windows = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in step_ranges]
    ours = [e for e in ranges if e["name"].startswith("batchdist/")]
    for e in ours:
        a, b = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if not any(lo - SLACK_US <= a and b <= hi + SLACK_US for lo, hi in windows):
            fail(f"{path}: {e['name']} at {a}..{b} is outside every traced step {windows}")
    # The trace ends with the last traced step: the run's evaluation after its
    # last step (the "short" run) stays out.
    end = max(hi for _, hi in windows)
    late = [e["name"] for e in ops if float(e["ts"]) > end + 1000]
    if late:
        fail(f"{path}: {len(late)} operator(s) more than 1 ms after the last traced step, e.g. {late[:3]}")
    for (lo, hi), s in zip(sorted(windows), steps):
        inside = [e["name"] for e in ours if lo - SLACK_US <= float(e["ts"]) <= hi + SLACK_US]
        for phase in PHASES:
            if phase not in inside:
                fail(f"{path}: step {s} has no {phase} range (has {sorted(set(inside))})")
        n_buckets = len([n for n in inside if n.startswith("batchdist/allreduce bucket ")])
        if buckets and n_buckets < buckets:
            fail(f"{path}: step {s} has {n_buckets} gradient buckets' allreduce ranges, expected {buckets}+")
    return len(events), len(ops)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    buckets = 0 if "--no-buckets" in sys.argv else 1
    for a in sys.argv[1:]:
        if a.startswith("--buckets="):
            buckets = int(a.split("=")[1])
    out, world, steps = args[0], int(args[1]), sorted(int(s) for s in args[2:])
    subdir = "profile"
    for a in sys.argv[1:]:
        if a.startswith("--dir="):
            subdir = a.split("=", 1)[1]
    if "--one-step" in sys.argv:
        steps = None
    files = sorted(glob.glob(os.path.join(out, subdir, "*.pt.trace.json")))
    if len(files) != world:
        fail(f"{len(files)} trace file(s) in {out}/{subdir}, expected {world}: {files}")
    for rank in range(world):
        mine = [f for f in files if f.endswith(f"_rank{rank}.pt.trace.json")]
        if len(mine) != 1:
            fail(f"no single trace of rank {rank} in {files}")
        n, ops = check_rank(mine[0], rank, world, steps, buckets)
        backend = json.load(open(mine[0]))["distributedInfo"]["backend"]
        print(f"ok: rank {rank}: {subdir}/{os.path.basename(mine[0])} ({backend}): {n} events, "
              f"{ops} operators, {'one step' if steps is None else f'steps {steps}'} with every phase")
    if "--no-report" in sys.argv:
        return
    report = json.load(open(os.path.join(out, "report.json")))
    p = report.get("profile", {})
    if p.get("steps") != steps or not p.get("file", "").endswith("_rank0.pt.trace.json"):
        fail(f"report.json profile: {p}")
    print(f"ok: report.json profile: {p}")


main()

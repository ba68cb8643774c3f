#!/usr/bin/env python3
"""The figures of bench/elastic.sh, from its stamped logs.

  figures.py record --system S --fault F --repeat N --dir RUNDIR --bound B   one JSON line
  figures.py brief                                   a JSON line on stdin -> a short summary
  figures.py table --runs runs.jsonl --bound B --json results.json

Every log line is "<unix time at arrival> <text>". RUNDIR/meta holds t_fault (the
wall clock at the injection) and recovered (1 when the smaller world trained
within the bound).
"""
import argparse
import json
import os
import re
import statistics
import sys


def read_meta(d):
    meta = {}
    with open(os.path.join(d, "meta")) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            meta[k] = v
    return meta


def stamped(path):
    """(time, text) per line of a stamped log."""
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                t, _, text = line.rstrip("\n").partition(" ")
                try:
                    out.append((float(t), text))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


def batchdist_record(d, t_fault, rec):
    log = stamped(os.path.join(d, "log"))
    rec["log"] = os.path.join(d, "log")
    for t, text in log:
        if t >= t_fault and re.search(r"elastic: (attempt \d+: lost rank\(s\)|host \S+ is lost|"
                                      r"attempt \d+ failed after|attempt \d+: hang)", text):
            rec["detection_s"] = round(t - t_fault, 2)
            rec["detection_line"] = text
            break
    for t, text in log:
        m = re.search(r"attempt (\d+) trains from step (\d+) on (\d+) rank\(s\).*lost (\d+) step", text)
        if m and t >= t_fault:
            rec["first_step_s"] = round(t - t_fault, 2)
            rec["first_step_line"] = text
            rec["resumed_from"] = int(m.group(2))
            rec["world_after"] = int(m.group(3))
            rec["steps_lost"] = int(m.group(4))
            break
    # G per attempt: elastic.json when the supervisor wrote it, else the attempt lines.
    path = os.path.join(d, "out", "elastic.json")
    attempts = []
    if os.path.exists(path):
        try:
            with open(path) as f:
                el = json.load(f)
            attempts = el.get("attempts", [])
            rec["elastic_json"] = {"attempts": [
                {k: a.get(k) for k in ("world", "per_gpu", "accum", "global", "start_step", "last_step",
                                       "lost_steps", "cause", "launched_s", "first_step_s", "ended_s")}
                for a in attempts]}
        except (OSError, ValueError):
            pass
    if len(attempts) >= 1:
        rec["g_before"] = attempts[0].get("global")
        rec["world_before"] = attempts[0].get("world")
        rec["last_step_before"] = attempts[0].get("last_step")
    if len(attempts) >= 2 and attempts[1].get("first_step_s", -1) is not None \
            and attempts[1].get("first_step_s", -1) >= 0:
        rec["g_after"] = attempts[1].get("global")
    gs = [int(m.group(2)) for _, text in log
          for m in [re.search(r"elastic: attempt (\d+): .*G=(\d+)", text)] if m]
    if rec.get("g_before") is None and gs:
        rec["g_before"] = gs[0]
    if rec.get("g_after") is None and len(gs) >= 2 and "first_step_s" in rec:
        rec["g_after"] = gs[1]


AGENT = re.compile(r"^(INFO|WARNING|ERROR|CRITICAL):torch\.distributed\.elastic")
FAILURE = re.compile(r"fail|FAIL|restart|closing signal|Stopping worker group|exitcode|"
                     r"RendezvousClosed|timed out|Traceback", re.I)


def torchrun_record(d, t_fault, rec):
    logs = {h: stamped(os.path.join(d, f"host{h}.log")) for h in (1, 2, 3, 4)}
    rec["log"] = os.path.join(d, "host*.log")
    # Detection: the first agent line on a surviving host (1-3) about the failure.
    first = None
    for h in (1, 2, 3):
        for t, text in logs[h]:
            if t >= t_fault and AGENT.match(text) and FAILURE.search(text):
                if first is None or t < first[0]:
                    first = (t, f"host {h}: {text}")
                break
    if first:
        rec["detection_s"] = round(first[0] - t_fault, 2)
        rec["detection_line"] = first[1][:300]
    # The first error any surviving worker printed (what Gloo said).
    for h in (1, 2, 3):
        for t, text in logs[h]:
            if t >= t_fault and re.search(r"RuntimeError|Error:", text) and not AGENT.match(text):
                if "worker_error_s" not in rec or t - t_fault < rec["worker_error_s"]:
                    rec["worker_error_s"] = round(t - t_fault, 2)
                    rec["worker_error_line"] = f"host {h}: {text[:300]}"
                break
    lines = sorted((t, text) for h in logs for t, text in logs[h])
    starts = [(float(m.group(1)), m.group(0)) for t, text in lines
              for m in [re.search(r"START (\S+) .*", text)] if m]
    steps = []
    for _, text in lines:
        # torchrun's tee prefixes "[default0]:"; the line's own clock (the tee's tail
        # polls its file) is the time of the step.
        m = re.search(r"STEP (\S+) step=(\d+) world=(\d+) G=(\d+)", text)
        if m:
            steps.append((float(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))))
    steps.sort()
    before = [s for s in steps if s[0] < t_fault]
    if before:
        rec["g_before"] = before[-1][3]
        rec["world_before"] = before[-1][2]
    w0 = rec.get("world_before", 4)
    at_w0 = [s for s in steps if s[2] == w0]
    if at_w0:
        rec["last_step_before"] = max(s[1] for s in at_w0)
    after = [s for s in steps if s[0] >= t_fault and s[2] < w0]
    if after:
        rec["first_step_s"] = round(after[0][0] - t_fault, 2)
        rec["world_after"] = after[0][2]
        rec["g_after"] = after[0][3]
        for t, text in starts:
            m = re.match(r"START \S+ world=(\d+) G=(\d+) resumed_from=(\d+)", text)
            if m and t >= t_fault and int(m.group(1)) == after[0][2]:
                rec["resumed_from"] = int(m.group(3))
        if "resumed_from" in rec and "last_step_before" in rec:
            rec["steps_lost"] = rec["last_step_before"] - rec["resumed_from"]
    rec["restarts"] = [text for t, text in starts]
    # The agents' last words (to tell a hang from an error), from the surviving hosts.
    rec["agent_tail"] = [f"host {h}: {text[:200]}" for h in (1, 2, 3)
                         for t, text in logs[h][-3:]]


def record(args):
    meta = read_meta(args.dir)
    rec = {"system": args.system, "fault": args.fault, "repeat": args.repeat, "dir": args.dir,
           "bound_s": args.bound}
    try:
        with open(os.path.join(args.dir, "fault")) as f:
            rec["injected"] = f.read().strip()
    except FileNotFoundError:
        pass
    if not meta.get("t_fault"):
        rec["error"] = "never reached a checkpoint past step 10"
        print(json.dumps(rec))
        return
    t_fault = float(meta["t_fault"])
    rec["t_fault"] = t_fault
    (batchdist_record if args.system == "batchdist" else torchrun_record)(args.dir, t_fault, rec)
    rec["recovered"] = "first_step_s" in rec
    print(json.dumps(rec))


def fmt_s(v, bound):
    return f"> {bound} s (not recovered)" if v is None else f"{v:.1f}"


def brief(_args):
    rec = json.loads(sys.stdin.readline())
    if rec.get("error"):
        return print(rec["error"])
    b = rec["bound_s"]
    det = rec.get("detection_s")
    print(f"detection {fmt_s(det, b) if det is not None else f'none within {b} s'}; "
          f"first step at W' {fmt_s(rec.get('first_step_s'), b)}; steps lost {rec.get('steps_lost', '-')}; "
          f"G {rec.get('g_before', '?')} -> {rec.get('g_after', '-')}")


def median_or_none(values):
    """The median; a run with no value (not within the bound) counts as the largest."""
    if not values:
        return None
    key = sorted(values, key=lambda v: float("inf") if v is None else v)
    n = len(key)
    if n % 2:
        return key[n // 2]
    a, b = key[n // 2 - 1], key[n // 2]
    return None if a is None or b is None else (a + b) / 2


def table(args):
    runs = []
    with open(args.runs) as f:
        for line in f:
            if line.strip():
                runs.append(json.loads(line))
    groups = {}
    for r in runs:
        groups.setdefault((r["fault"], r["system"]), []).append(r)
    rows, summary = [], []
    print("| fault | system | detection s | first step at W' s | steps lost | G before -> after | runs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (fault, system), rs in groups.items():
        ok = [r for r in rs if not r.get("error")]
        det = median_or_none([r.get("detection_s") for r in ok])
        first = median_or_none([r.get("first_step_s") for r in ok])
        lost = median_or_none([r.get("steps_lost") for r in ok if r.get("steps_lost") is not None])
        recovered = sum(1 for r in ok if r.get("recovered"))
        gb = sorted({r.get("g_before") for r in ok if r.get("g_before") is not None})
        ga = sorted({r.get("g_after") for r in ok if r.get("g_after") is not None})
        g_after = "/".join(map(str, ga)) or "- (no step at W')"
        wb = sorted({r.get("world_before") for r in ok if r.get("world_before") is not None})
        wa = sorted({r.get("world_after") for r in ok if r.get("world_after") is not None})
        g = (f"{'/'.join(map(str, gb)) or '?'} -> {g_after} "
             f"(W {'/'.join(map(str, wb)) or '?'} -> {'/'.join(map(str, wa)) or '-'})")
        det_text = f"none within {args.bound} s" if det is None else f"{det:.1f}"
        lost_text = "-" if lost is None else (f"{lost:g}")
        each = ", ".join(fmt_s(r.get("first_step_s"), args.bound).replace(" (not recovered)", "")
                         for r in ok)
        print(f"| {fault} | {system} | {det_text} | {fmt_s(first, args.bound)} | {lost_text} | {g} | "
              f"{recovered}/{len(rs)} recovered ({each}) |")
        summary.append({"fault": fault, "system": system, "runs": len(rs), "recovered": recovered,
                        "median_detection_s": det, "median_first_step_s": first,
                        "median_steps_lost": lost, "g_before": gb, "g_after": ga})
    print()
    systems = sorted({r["system"] for r in runs})
    if "batchdist" in systems:
        print("batchdist: checkpoint every 5 steps (checkpoint.every_steps=5); G fixed at 96 "
              "(24 x 1 x 4, then 16 x 2 x 3); heartbeat 0.5 s, timeout 3 s; model.batchnorm=false")
    if "torchrun" in systems:
        print("torchrun: checkpoint every 5 steps (ddp_elastic.py --every 5); 24 per process, "
              "G = 24 x world; Gloo default timeout (30 min); c10d rendezvous defaults "
              "(last_call 30 s); --max_restarts=3")
    with open(args.json, "w") as f:
        json.dump({"bound_s": args.bound, "summary": summary, "runs": runs}, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--system", required=True)
    r.add_argument("--fault", required=True)
    r.add_argument("--repeat", type=int, required=True)
    r.add_argument("--dir", required=True)
    r.add_argument("--bound", type=int, required=True)
    sub.add_parser("brief")
    t = sub.add_parser("table")
    t.add_argument("--runs", required=True)
    t.add_argument("--bound", type=int, required=True)
    t.add_argument("--json", required=True)
    args = ap.parse_args()
    {"record": record, "brief": brief, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()

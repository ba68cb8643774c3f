"""A batchdist run's TensorBoard events, read by TensorBoard's own loader.

Note [tensorboard events] (worker/report/tensorboard.h): OUTPUT/tensorboard/train
holds the training run, OUTPUT/tensorboard/search the batch search, and the
logdir itself no event file (TensorBoard would list it as a run named "."). This loads both
with tensorboard.backend.event_processing.event_accumulator (every scalar kept),
as `tensorboard --logdir` would, and compares them with metrics.jsonl and
search.json:

  tensorboard_check.py RUN_DIR [--search] [--resumed-step S --files N]

--search: the search's series must be there (one point per candidate that fit).
--resumed-step S: the run was resumed from the checkpoint at step S: N event
files, the last opening with SessionLog START at S + 1, the first holding steps
past S that TensorBoard must have dropped (purged) in favour of the resumed run's.
Exits 1 with a message naming the tag and step on the first mismatch.
"""

import argparse
import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import event_file_loader

STEP_TAGS = {  # tag -> metrics.jsonl key of a "step" line
    "train/loss": "train_loss",
    "train/lr": "lr",
    "train/samples_per_s": "samples_per_s",
    "batch/global": "global_batch",
    "batch/per_gpu": "per_gpu_batch",
    "batch/accum": "accum",
    "time/data_wait": "data_wait_fraction",
    "time/compute": "compute_fraction",
    "time/communication": "comm_fraction",
    "time/skew": "skew_fraction",
    "memory/peak_mb": "peak_memory_mb",
    "noise/B_simple": "noise_scale",  # only where known (> 0)
    "train/tokens_per_s": "tokens_per_s",  # token data only (Note [tokens per sample])
    "batch/global_tokens": "tokens_per_step",
    "train/mfu": "mfu",  # where known (Note [mfu])
}
EPOCH_TAGS = {  # tag -> key of an "epoch" line
    "eval/loss": "eval_loss",
    "eval/accuracy": "eval_accuracy",
    "train/epoch_loss": "train_loss",
    "train/epoch_samples_per_s": "samples_per_s",
    "train/epoch_tokens_per_s": "tokens_per_s",  # token data only
    "train/epoch_mfu": "mfu",  # where known
}
# Absent from a line: not token data, or the MFU unknown.
OPTIONAL_KEYS = {"tokens_per_s", "tokens_per_step", "mfu"}
# Note [system metrics]: the ones a step line has (those read in its interval)
# are system/<key> at its step; how many depends on how long the run sampled.
SYSTEM_KEYS = ["gpu_util_pct", "gpu_memory_util_pct", "gpu_memory_used_mb", "gpu_memory_total_mb",
               "gpu_power_w", "gpu_power_limit_w", "gpu_temperature_c", "gpu_sm_clock_mhz",
               "gpu_power_throttled", "gpu_thermal_throttled", "cpu_process_pct", "cpu_host_pct",
               "loader_busy"]


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def load(path):
    acc = ea.EventAccumulator(path, size_guidance={ea.SCALARS: 0})  # 0: keep every point
    acc.Reload()
    return acc


def same_float(got, want):
    # simple_value is a float32: equal to the JSON double rounded to float precision.
    return math.isclose(got, want, rel_tol=2 ** -23, abs_tol=1e-30)


def compare(acc, expected, where):
    tags = set(acc.Tags()["scalars"])
    missing = sorted(set(expected) - tags)
    if missing:
        fail(f"{where}: TensorBoard lists no {missing}; it has {sorted(tags)}")
    # A tag whose every point a resume purged (Note [tensorboard events]) stays
    # listed with no points: TensorBoard draws nothing for it, so it is no extra.
    extra = sorted(t for t in tags - set(expected) if acc.Scalars(t))
    if extra:
        fail(f"{where}: tags {extra} have no counterpart in the run's own records")
    for tag, want in sorted(expected.items()):
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        if [s for s, _ in got] != [s for s, _ in want]:
            fail(f"{where}: {tag} has steps {[s for s, _ in got]}, expected {[s for s, _ in want]}")
        for (step, g), (_, w) in zip(got, want):
            if not same_float(g, w):
                fail(f"{where}: {tag} at step {step} is {g!r}, the run's record says {w!r}")
    return sum(len(v) for v in expected.values())


def expected_training(metrics_path):
    expected = {}
    with open(metrics_path) as f:
        for n, line in enumerate(f, 1):
            m = json.loads(line)
            tags = EPOCH_TAGS if m["kind"] == "epoch" else STEP_TAGS
            for tag, key in tags.items():
                v = m.get(key)
                if tag == "noise/B_simple" and (v is None or v <= 0):
                    continue
                if key in OPTIONAL_KEYS and key not in m:
                    continue
                if v is None:
                    fail(f"{metrics_path}:{n}: {key} is null (a non-finite value?)")
                expected.setdefault(tag, []).append((m["step"], float(v)))
            for key in SYSTEM_KEYS if m["kind"] == "step" else []:
                if key in m:
                    expected.setdefault("system/" + key, []).append((m["step"], float(m[key])))
    return expected


def raw_events(path):
    return list(event_file_loader.EventFileLoader(path).Load())


def event_files(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if "tfevents" in f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--search", action="store_true")
    ap.add_argument("--resumed-step", type=int, default=-1)
    ap.add_argument("--files", type=int, default=1)
    a = ap.parse_args()
    logdir = os.path.join(a.run, "tensorboard")
    if event_files(logdir):
        fail(f"{logdir} holds event files {event_files(logdir)}: TensorBoard would show a run named '.'")
    tb = os.path.join(logdir, "train")

    files = event_files(tb)
    if len(files) != a.files:
        fail(f"{tb} has {len(files)} event files {files}, expected {a.files}")
    for path in files:
        ev = raw_events(path)
        if len(ev) < 2 or ev[0].file_version != "brain.Event:2":
            fail(f"{path} does not open with file_version brain.Event:2")
        start = ev[1]
        if not start.HasField("session_log") or start.session_log.status != start.session_log.START:
            fail(f"{path}: the second event is not a SessionLog START")
    if a.resumed_step >= 0:
        s = a.resumed_step
        if raw_events(files[-1])[1].step != s + 1:
            fail(f"{files[-1]}: START at step {raw_events(files[-1])[1].step}, expected {s + 1}")
        past = [e.step for e in raw_events(files[0]) if e.HasField("summary") and e.step > s]
        if not past:
            fail(f"{files[0]} holds no step past the checkpoint's {s}: the purge went untested")
        print(f"ok: {files[0]} holds {len(past)} events past step {s} (steps {past[0]}..{past[-1]}),"
              f" made again after the resume")

    acc = load(tb)
    expected = expected_training(os.path.join(a.run, "metrics.jsonl"))
    points = compare(acc, expected, tb)
    loss_steps = [e.step for e in acc.Scalars("train/loss")]
    if loss_steps != sorted(set(loss_steps)):
        fail(f"train/loss steps are not strictly increasing: {loss_steps}")
    with open(os.path.join(a.run, "report.json")) as f:
        steps = json.load(f)["steps"]
    if loss_steps[-1] != steps:
        fail(f"train/loss ends at step {loss_steps[-1]}, the run made {steps}")
    if a.resumed_step >= 0:
        after = [s for s in loss_steps if s > a.resumed_step]
        before = [s for s in loss_steps if s <= a.resumed_step]
        if not after or not before:
            fail(f"train/loss does not span the resume at step {a.resumed_step}: {loss_steps}")
    print(f"ok: {tb}: {len(expected)} tags, {points} points equal to metrics.jsonl;"
          f" train/loss at {len(loss_steps)} steps {loss_steps[0]}..{loss_steps[-1]}")

    sd = os.path.join(logdir, "search")
    if a.search:
        with open(os.path.join(a.run, "search.json")) as f:
            search = json.load(f)
        fit = sorted((c for c in search["candidates"] if not c["failed"]),
                     key=lambda c: c["per_gpu_batch"])
        if len(fit) < 3:
            fail(f"search.json has {len(fit)} candidates that fit; the test needs at least 3")
        want = {
            "search/samples_per_s": [(c["per_gpu_batch"], c["samples_per_s"]) for c in fit],
            "search/peak_memory_mb": [(c["per_gpu_batch"], c["peak_memory_mb"]) for c in fit],
        }
        if "tokens_per_sample" in search:  # token data (Note [tokens per sample])
            want["search/tokens_per_s"] = [(c["per_gpu_batch"], c["tokens_per_s"]) for c in fit]
        n = compare(load(sd), want, sd)
        print(f"ok: {sd}: {n} points equal to search.json's {len(fit)} candidates that fit")
    elif os.path.exists(sd):
        fail(f"{sd} exists, but this run did not search")


if __name__ == "__main__":
    main()

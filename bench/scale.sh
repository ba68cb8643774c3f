#!/usr/bin/env bash
# Benchmark, not a test: how each phase of a run grows with the world size.
# Runs the real binary at W = 2, 4, 8, 16, 32, 64 ranks on this one host
# (oversubscribed, 1 thread per rank), with the MPI backend and with Gloo, on a
# small synthetic workload (configs/scale.yaml): a batch search over 3 candidates,
# 16 steps with checkpoints at steps 8 and 16, an evaluation; then a second run
# resumes from the step-16 checkpoint and trains to step 24. Rank 0 times each
# phase (OUTPUT/phases.json, Note [phases] in worker/run.cc):
#   load         process start -> main(): loading the binary and LibTorch
#   mpi_init     MPI_Init_thread (mpirun's own launch is not included)
#   setup        config, device, data, plan (agreed over MPI)
#   rendezvous   c10d store + process group + the config check
#   search       the batch search (3 candidates)
#   first_step   the first training step; steady_step: the median of the others
#   checkpoint   the mean checkpoint write; resume_read: loading it (second run)
#   eval         the evaluation
#   shutdown     report written -> mpirun returned (process group, MPI_Finalize)
# Oversubscription inflates everything that computes (W ranks share 2 cores):
# read the growth between rows, not the absolute figures. Medians of REPEAT runs.
#   bench/scale.sh [BATCHDIST_BIN] [REPEAT] [WORLDS] [BACKENDS] [OUTDIR]
#     (OUTDIR: a fresh mktemp -d /tmp/batchdist-scale.XXXXXX unless given)
#   bench/scale.sh --summary OUTDIR      (the table and plot again, from OUTDIR/runs.jsonl)
# Prints a table per backend and writes OUTDIR/scale.svg (each phase against W,
# log-log) and OUTDIR/scale.json.
set -euo pipefail
summary_only=false
if [ "${1:-}" = --summary ]; then summary_only=true; shift; set -- "" "" "" "" "$1"; fi
bin=${1:-build/launcher/batchdist}
repeat=${2:-3}
worlds=${3:-2 4 8 16 32 64}
backends=${4:-mpi gloo}
outdir=${5:-$(mktemp -d /tmp/batchdist-scale.XXXXXX)}
here=$(cd "$(dirname "$0")" && pwd)
cfg=$here/../configs/scale.yaml
flags=(--oversubscribe --bind-to none -x OMP_NUM_THREADS=1)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
mkdir -p "$outdir"
cores=$(nproc)
$summary_only || { rm -f "$outdir/runs.jsonl"; echo "host: $cores cores, $(uptime)"; }
now() { date +%s.%N; }

# one BACKEND W REP: a fresh run and a resumed run; appends their phases to runs.jsonl.
one() {
  local backend=$1 w=$2 rep=$3 out=$outdir/run-$1-$2-$3
  rm -rf "$out"
  local sets=(--set dist.backend="$backend" --set train.threads=1 -q)
  mpirun "${flags[@]}" -np "$w" "$bin" train "$cfg" --output "$out/a" "${sets[@]}" >"$out.a.log" 2>&1 ||
    { echo "run failed: $backend W=$w (log $out.a.log)"; tail -5 "$out.a.log"; exit 1; }
  local end_a; end_a=$(now)
  mpirun "${flags[@]}" -np "$w" "$bin" train "$cfg" --output "$out/b" "${sets[@]}" \
    --resume "$out/a/checkpoints" --set train.max_steps=24 >"$out.b.log" 2>&1 ||
    { echo "resume failed: $backend W=$w (log $out.b.log)"; tail -5 "$out.b.log"; exit 1; }
  local end_b; end_b=$(now)
  python3 - "$out/a/phases.json" "$out/b/phases.json" "$end_a" "$end_b" "$backend" "$rep" >>"$outdir/runs.jsonl" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
end_a, end_b = float(sys.argv[3]), float(sys.argv[4])
row = {"backend": sys.argv[5], "rep": int(sys.argv[6]), "world": a["world_size"]}
for k in ("load", "mpi_init", "setup", "rendezvous", "search", "first_step", "steady_step",
          "checkpoint_write", "eval"):
    row[k] = a.get(k, -1)
row["resume_read"] = b.get("resume_read", -1)
row["shutdown"] = end_a - a["done_unix_s"]
print(json.dumps(row))
PY
}

# Interleaved: every (backend, W) once per round, rounds repeated.
$summary_only && repeat=0
for rep in $(seq 1 "$repeat"); do
  for w in $worlds; do
    for backend in $backends; do
      one "$backend" "$w" "$rep"
      echo "round $rep: $backend W=$w done" >&2
    done
  done
done

python3 - "$outdir" "$cores" <<'PY'
import json, math, statistics, sys, os
outdir, cores = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(os.path.join(outdir, "runs.jsonl"))]
phases = ["load", "mpi_init", "setup", "rendezvous", "search", "first_step", "steady_step",
          "checkpoint_write", "resume_read", "eval", "shutdown"]
table = {}
for r in rows:
    for p in phases:
        table.setdefault((r["backend"], r["world"], p), []).append(r[p])
med = {k: statistics.median(v) for k, v in table.items()}
backends = sorted({r["backend"] for r in rows})
worlds = sorted({r["world"] for r in rows})
json.dump({f"{b}/{w}/{p}": med[(b, w, p)] for (b, w, p) in med}, open(os.path.join(outdir, "scale.json"), "w"), indent=1)

def growth(b, p):
    # The slope of log(time) against log(W) between the two largest worlds, and
    # over the whole range: ~0 is O(1), ~1 is O(W); in between, O(log W) or noise.
    xs = [w for w in worlds if med[(b, w, p)] > 0]
    if len(xs) < 2: return "-"
    lo, hi = xs[0], xs[-1]
    return "%.2f" % (math.log(med[(b, hi, p)] / med[(b, lo, p)]) / math.log(hi / lo))

for b in backends:
    print(f"\nbackend {b}: rank 0's median seconds per phase over the runs (1 thread per rank, oversubscribed)")
    print("%-17s" % "phase" + "".join("%9s" % f"W={w}" for w in worlds) + "   slope  per core")
    for p in phases:
        cells = "".join("%9.3f" % med[(b, w, p)] if med[(b, w, p)] >= 0 else "%9s" % "-" for w in worlds)
        g = growth(b, p)
        print("%-17s" % p + cells + "%8s" % g + "%10s" % ("-" if g == "-" else "%.2f" % (float(g) - 1)))
print("\nslope: d log(time) / d log(W) from the smallest to the largest W (0: constant, 1: linear in W).")
print(f"per core: the slope less 1. With W ranks on {cores} cores, a phase in which every rank does")
print("the same work alone takes W/cores times as long: its slope is 1 from sharing the cores, and")
print("what is left is the growth of each rank's own work (0: O(1) per rank, 1: O(W) per rank).")

# The plot: one panel per backend, each phase against W, log-log.
colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000"]
pw, ph, m = 460, 340, 60
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{pw * len(backends) + 170}" height="{ph + 40}" font-family="sans-serif" font-size="11">']
vals = [v for v in med.values() if v > 0]
ymin, ymax = 10 ** math.floor(math.log10(min(vals))), 10 ** math.ceil(math.log10(max(vals)))
def X(w, i): return i * pw + m + (math.log(w / worlds[0]) / math.log(worlds[-1] / worlds[0])) * (pw - m - 20)
def Y(v): return ph - 30 - (math.log(v / ymin) / math.log(ymax / ymin)) * (ph - 60)
for i, b in enumerate(backends):
    svg.append(f'<text x="{i * pw + pw / 2}" y="16" text-anchor="middle" font-size="13">backend {b}: seconds (rank 0) against world size</text>')
    svg.append(f'<rect x="{i * pw + m}" y="30" width="{pw - m - 20}" height="{ph - 60}" fill="none" stroke="#999"/>')
    for w in worlds:
        svg.append(f'<text x="{X(w, i)}" y="{ph - 14}" text-anchor="middle">{w}</text>')
    e = ymin
    while e <= ymax * 1.001:
        svg.append(f'<line x1="{i * pw + m}" x2="{i * pw + pw - 20}" y1="{Y(e)}" y2="{Y(e)}" stroke="#eee"/>')
        svg.append(f'<text x="{i * pw + m - 4}" y="{Y(e) + 4}" text-anchor="end">{e:g}</text>')
        e *= 10
    # Reference: slope 1, what sharing the cores alone gives a phase of constant work per rank.
    y0 = ymin * 10
    svg.append('<polyline fill="none" stroke="#888" stroke-dasharray="5,4" points="%.1f,%.1f %.1f,%.1f"/>' % (
        X(worlds[0], i), Y(y0), X(worlds[-1], i), Y(y0 * worlds[-1] / worlds[0])))
    for j, p in enumerate(phases):
        pts = [(X(w, i), Y(med[(b, w, p)])) for w in worlds if med[(b, w, p)] > 0]
        if len(pts) > 1:
            svg.append('<polyline fill="none" stroke-width="2" stroke="%s" points="%s"/>' % (colors[j], " ".join("%.1f,%.1f" % q for q in pts)))
svg.append(f'<line x1="{pw * len(backends) + 10}" x2="{pw * len(backends) + 30}" y1="{40 + len(phases) * 18}" y2="{40 + len(phases) * 18}" stroke="#888" stroke-dasharray="5,4"/><text x="{pw * len(backends) + 36}" y="{44 + len(phases) * 18}">slope 1: shared cores</text>')
for j, p in enumerate(phases):
    y = 40 + j * 18
    x = pw * len(backends) + 10
    svg.append(f'<line x1="{x}" x2="{x + 20}" y1="{y}" y2="{y}" stroke="{colors[j]}" stroke-width="2"/><text x="{x + 26}" y="{y + 4}">{p}</text>')
svg.append("</svg>")
open(os.path.join(outdir, "scale.svg"), "w").write("\n".join(svg))
print(f"wrote {outdir}/scale.svg and {outdir}/scale.json")
PY

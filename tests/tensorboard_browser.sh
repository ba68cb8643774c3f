#!/usr/bin/env bash
# TensorBoard itself serving a real run's events (Note [tensorboard events]): a
# 2-rank quickstart with the batch searched, then `tensorboard --logdir
# OUT/run/tensorboard` from the venv of tests/tensorboard_venv.sh on a free port of
# 127.0.0.1. Checked two ways: its HTTP data API (/data/runs, /data/plugin/scalars/
# tags and the train/loss points) and its web app in Debian's headless chromium
# (every other host unreachable): the runs table names both runs ("train" and
# "search") and the train/loss card holds a line chart. Leaves OUT/tensorboard.png (a screenshot) and OUT/dom.html. Fails, not
# skips, when chromium or the venv cannot be had. TensorBoard is killed on exit.
#   tensorboard_browser.sh MPIRUN "MPI_FLAGS" BIN SRC_DIR OUT
set -uo pipefail
MPIRUN=$1 MPI_FLAGS=$2 BIN=$3 SRC=$4 OUT=$5

fail() { echo "FAIL: $*" >&2; exit 1; }
. "$SRC/tests/tensorboard_lib.sh"
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || fail "chromium not found; install it (Debian: apt-get install chromium, as in the README's test command)"
rm -rf "$OUT" && mkdir -p "$OUT" || fail "cannot create $OUT"
venv=$(bash "$SRC/tests/tensorboard_venv.sh") || fail "no TensorBoard venv (see above)"
py=$venv/bin/python

# shellcheck disable=SC2086
$MPIRUN $MPI_FLAGS -np 2 "$BIN" "$SRC/configs/quickstart.yaml" --set batch.per_gpu=auto \
  --set train.epochs=3 --output "$OUT/run" --quiet > "$OUT/run.log" 2>&1 \
  || { cat "$OUT/run.log"; fail "the run failed"; }
logdir=$OUT/run/tensorboard
steps=$(grep -c '^{"kind":"step"' "$OUT/run/metrics.jsonl")
[ "$steps" -ge 3 ] || fail "metrics.jsonl has $steps step lines"

start_tensorboard "$venv" "$logdir" "$OUT/tensorboard.log"

# The data API: both runs and their tags, once TensorBoard has loaded them (bounded).
"$py" - "$url" "$steps" <<'PY' || { tail -n 20 "$OUT/tensorboard.log"; fail "TensorBoard's data API (above)"; }
import json, sys, time, urllib.parse, urllib.request
url, steps = sys.argv[1], int(sys.argv[2])
def get(path):
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.load(r)
deadline, tags, err = time.time() + 90, {}, None
while time.time() < deadline:
    try:
        tags = get("/data/plugin/scalars/tags")
        if "train/loss" in tags.get("train", {}) and "search/samples_per_s" in tags.get("search", {}):
            break
    except OSError as e:
        err = e
    time.sleep(0.5)
else:
    sys.exit(f"no train/loss in run 'train' and search/samples_per_s in run 'search' after 90 s: {tags or err}")
runs = get("/data/runs")
if sorted(runs) != ["search", "train"]:
    sys.exit(f"/data/runs lists {runs}, expected ['search', 'train']")
q = urllib.parse.urlencode({"run": "train", "tag": "train/loss"})
points = get("/data/plugin/scalars/scalars?" + q)
if [p[1] for p in points] != sorted({p[1] for p in points}) or len(points) != steps:
    sys.exit(f"train/loss has {len(points)} points at steps {[p[1] for p in points]}, expected {steps}")
print(f"ok: {url}/data: runs {runs}, {len(tags['train'])} scalar tags in 'train', "
      f"{len(tags['search'])} in 'search', train/loss at {len(points)} steps")
PY

# The web app: no host but 127.0.0.1 resolves.
flags=(--headless --disable-gpu --no-sandbox --user-data-dir="$OUT/profile" --disable-dev-shm-usage
       --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" --window-size=1400,1000
       --virtual-time-budget=60000 --run-all-compositor-stages-before-draw)
# The Time Series dashboard with its tag filter (a URL parameter) on train/loss: the
# card is rendered at the top instead of below the other groups' (cards out of view
# are rendered lazily, so they would not be in the DOM).
page="$url/?forceSVG=true&tagFilter=train%2Floss#timeseries"
# The chart, checked in the dumped DOM: forceSVG=true (a TensorBoard URL flag) draws
# the lines as SVG paths, so the DOM shows what was drawn (headless chromium has no
# GPU for the WebGL renderer). Exit 0: a line with one vertex per step; 3: not drawn
# yet (no card, no chart or no path); 1: drawn but wrong.
check_chart() {
  "$py" - "$OUT/dom.html" "$steps" <<'PY'
import re, sys
dom, steps = open(sys.argv[1], errors="replace").read(), int(sys.argv[2])
if 'title="train/loss"' not in dom or "<scalar-card" not in dom:
    print("the train/loss card is not rendered yet"); sys.exit(3)
at = dom.find("<line-chart")
if at < 0:
    print("the train/loss card has no line chart yet"); sys.exit(3)
lines = re.findall(r'<path d="(M[-0-9.,]+(?:L[-0-9.,]+)+)"', dom[at:])
if not lines:
    print("the line chart has no line drawn yet"); sys.exit(3)
vertices = lines[0].count("L") + 1
if vertices != steps:
    print(f"the train/loss line has {vertices} points, metrics.jsonl has {steps} steps"); sys.exit(1)
print(f"ok: the train/loss chart draws {vertices} points")
PY
}
# The app loads its data in a chain of requests and draws the chart after the last
# answer; under virtual time on a loaded machine a dump now and then comes before
# that (a spinner, or a card with an empty chart: CI saw both), so up to 6 tries,
# each a fresh chromium, until the line is drawn.
chart=3
for try in 1 2 3 4 5 6; do
  timeout 120 "$CHROMIUM" "${flags[@]}" --dump-dom "$page" > "$OUT/dom.html" 2> "$OUT/chromium.log" \
    || { tail -n 20 "$OUT/chromium.log"; fail "chromium --dump-dom $page failed"; }
  msg=$(check_chart); chart=$?
  [ "$chart" -eq 3 ] || break
  echo "try $try: $msg; again"
done
grep -q '<tb-webapp' "$OUT/dom.html" || fail "TensorBoard's app did not load ($OUT/dom.html)"
# The runs table: one row per run, named by data-id ("<experiment>/<run>").
for run in train search; do
  grep -q "data-id=\"defaultExperimentId/$run\"" "$OUT/dom.html" \
    || fail "run '$run' is not in TensorBoard's runs table ($OUT/dom.html)"
done
[ "$chart" -eq 0 ] || fail "the train/loss chart after $try tries: $msg ($OUT/dom.html)"
echo "$msg"
timeout 120 "$CHROMIUM" "${flags[@]}" --screenshot="$OUT/tensorboard.png" "$page" >> "$OUT/chromium.log" 2>&1 \
  || { tail -n 20 "$OUT/chromium.log"; fail "chromium --screenshot $page failed"; }
size=$(stat -c %s "$OUT/tensorboard.png" 2>/dev/null || echo 0)
[ "$size" -gt 20000 ] || fail "the screenshot $OUT/tensorboard.png is $size bytes: blank?"
echo "ok: TensorBoard $("$venv/bin/tensorboard" --version 2>/dev/null | tail -1) shows the run in" \
  "$("$CHROMIUM" --version 2>/dev/null | head -1); screenshot $OUT/tensorboard.png ($size bytes)"

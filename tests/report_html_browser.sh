#!/bin/bash
# report.html in a real browser: a 2-rank quickstart run with the batch searched,
# then Debian's chromium (headless, network cut off) loads OUT/run/report.html.
# Fails when chromium is missing (apt-get install chromium), when the page logs a
# console error or tries to fetch anything, or when a plot is missing from the DOM.
# Leaves OUT/report.png (a screenshot) and OUT/dom.html for a person to look at.
#   report_html_browser.sh MPIRUN "MPI_FLAGS" BIN SRC_DIR OUT
set -uo pipefail
MPIRUN=$1 MPI_FLAGS=$2 BIN=$3 SRC=$4 OUT=$5

fail() { echo "FAIL: $*" >&2; exit 1; }

CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[ -n "$CHROMIUM" ] || fail "chromium not found; install it (Debian: apt-get install chromium, as in the README's test command)"

rm -rf "$OUT" && mkdir -p "$OUT" || fail "cannot create $OUT"
# shellcheck disable=SC2086
$MPIRUN $MPI_FLAGS -np 2 "$BIN" "$SRC/configs/quickstart.yaml" --set batch.per_gpu=auto \
  --set train.epochs=4 --output "$OUT/run" --quiet > "$OUT/run.log" 2>&1 \
  || { cat "$OUT/run.log"; fail "the run failed"; }
PAGE=$OUT/run/report.html
for f in "$PAGE" "$OUT/run/metrics.jsonl" "$OUT/run/report.json" "$OUT/run/search.json"; do
  [ -s "$f" ] || fail "$f is missing or empty"
done
lines=$(grep -c '^{"kind":"step"' "$OUT/run/metrics.jsonl")
epochs=$(grep -c '^{"kind":"epoch"' "$OUT/run/metrics.jsonl")
[ "$epochs" -eq 4 ] || fail "metrics.jsonl has $epochs epoch lines, expected 4"
[ "$lines" -ge 8 ] || fail "metrics.jsonl has $lines step lines, expected at least 8"

# No network: every host name resolves to nothing, so a fetch would log an error.
flags=(--headless --disable-gpu --no-sandbox --user-data-dir="$OUT/profile" --disable-dev-shm-usage
       --host-resolver-rules="MAP * ~NOTFOUND" --enable-logging=stderr --v=0
       --virtual-time-budget=2000)
timeout 120 "$CHROMIUM" "${flags[@]}" --dump-dom "file://$PAGE" > "$OUT/dom.html" 2> "$OUT/console.log" \
  || { cat "$OUT/console.log"; fail "chromium --dump-dom failed"; }
timeout 120 "$CHROMIUM" "${flags[@]}" --window-size=1100,3000 --screenshot="$OUT/report.png" \
  "file://$PAGE" >> "$OUT/console.log" 2>&1 \
  || { cat "$OUT/console.log"; fail "chromium --screenshot failed"; }

# Console errors of the page (chromium logs them as CONSOLE lines), failed loads.
if grep -E 'CONSOLE|Uncaught|Failed to load resource|ERR_NAME_NOT_RESOLVED' "$OUT/console.log"; then
  fail "the page logged errors in the browser (see above, $OUT/console.log)"
fi
# Self-contained: nothing in the rendered page refers to another resource
# (chromium does not log a blocked load, so this is checked in the DOM).
if grep -Eo '(src|href|xlink:href)="[^"#][^"]*"|url\(|<script|<link|<iframe' "$OUT/dom.html"; then
  fail "the page refers to other resources (see above); it must be self-contained"
fi
grep -q '<h1>batchdist run report</h1>' "$OUT/dom.html" || fail "the page did not render (no heading in the DOM)"
for id in plot-search search-choice plot-loss plot-accuracy plot-lr plot-throughput plot-time \
          plot-noise card-throughput card-memory card-noise diagnosis plan; do
  grep -q "id=\"$id\"" "$OUT/dom.html" || fail "#$id is missing from the page"
done
points=$(grep -o '<circle class="sps"' "$OUT/dom.html" | wc -l)
[ "$points" -ge 3 ] || fail "the search plot has $points measured points, expected at least 3"
series=$(grep -o '<polyline class="series"' "$OUT/dom.html" | wc -l)
[ "$series" -ge 6 ] || fail "the training plots have $series lines, expected at least 6"
grep -q 'B_simple' "$OUT/dom.html" || fail "the noise scale is not on the page"
size=$(stat -c %s "$OUT/report.png" 2>/dev/null || echo 0)
[ "$size" -gt 20000 ] || fail "the screenshot $OUT/report.png is $size bytes: blank?"
echo "ok: report.html loads in $("$CHROMIUM" --version 2>/dev/null | head -1) without console errors;" \
  "$points search points, $series curves; screenshot $OUT/report.png ($size bytes)"

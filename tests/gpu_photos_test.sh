#!/usr/bin/env bash
# The photos path of bench/gpu_photos.py (the photos step of bench/gpu_acceptance.sh),
# which tests/gpu_acceptance_test.sh cannot count on: --source photos makes real
# photos (bench/photo_folder.py from scikit-image's) or fails, so this test sees
# the path taken, not a fallback. It needs a Python with PIL, numpy and
# scikit-image's photos; where none of python3 and /usr/bin/python3 has them it
# exits 77 (ctest: Skipped) naming what to install, never passes without them.
#   tests/gpu_photos_test.sh bench/gpu_photos.py
set -uo pipefail
photos=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

py=""
for p in "$(command -v python3 || true)" /usr/bin/python3; do
  [ -x "$p" ] || continue
  # The same test gpu_photos.py makes: the modules, and the photos themselves.
  if "$p" - "$(dirname "$photos")" 2>/dev/null <<'PY'; then py=$p; break; fi
import importlib.util, os, sys
sys.path.insert(0, sys.argv[1])
import gpu_photos
spec = importlib.util.spec_from_file_location("pf", os.path.join(sys.argv[1], "photo_folder.py"))
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)  # imports numpy and PIL
need = [f for files in mod.PHOTOS.values() for f in files]
sys.exit(0 if any(all(os.path.isfile(os.path.join(d, f)) for f in need) for d in gpu_photos.skimage_data()) else 1)
PY
done
if [ -z "$py" ]; then
  echo "SKIP: neither python3 nor /usr/bin/python3 has PIL, numpy and scikit-image's photos" \
       "(Debian: apt-get install python3-pil python3-numpy python3-skimage)"
  exit 77
fi

"$py" "$photos" "$tmp/f" --count 16 --repeat 2 --source photos --fallback-python "" >"$tmp/log" 2>&1 ||
  { cat "$tmp/log"; fail "$py $photos --source photos failed"; }
cat "$tmp/log"
"$py" - "$tmp/f/photos.json" <<'PY' || fail "photos.json (above)"
import json, sys
j = json.load(open(sys.argv[1]))
print(json.dumps(j))
want = {"source": "photos", "why_not_photos": None, "files": 16, "classes": 8, "list_entries": 32}
bad = {k: (j.get(k), v) for k, v in want.items() if j.get(k) != v}
lo, hi = j.get("longer_side_px") or (0, 0)
if not (300 <= lo <= hi <= 600):
    bad["longer_side_px"] = (j.get("longer_side_px"), "within [300, 600]")
if "photo_folder.py" not in (j.get("generator") or ""):
    bad["generator"] = (j.get("generator"), "bench/photo_folder.py")
for k, (got, exp) in bad.items():
    print(f"FAIL {k}: {got!r}, want {exp!r}")
sys.exit(1 if bad else 0)
PY
echo "ok   $py: 16 photos in 8 classes"

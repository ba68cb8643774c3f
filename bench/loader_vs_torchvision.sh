#!/usr/bin/env bash
# Benchmark, not a test: batchdist's input pipeline against torchvision's on the
# same folder of JPEG photos, the same threads, uint8 output on both sides:
#   tvT  torchvision: ImageFolder + DataLoader(batch 32, num_workers=T, shuffle,
#        drop_last, persistent workers), RandomResizedCrop(224),
#        RandomHorizontalFlip, PILToTensor (uint8 CHW), torch.set_num_threads(1)
#        (bench/torchvision_loader.py, Debian's python3-torchvision and PIL)
#   bdT  `batchdist data` on 1 rank with data.workers=T, batch 32: read, decode
#        (DCT-scaled, windowed), RandomResizedCrop(224) + flip, uint8 NHWC batches
#   loop the limit: a plain loop on 1 thread that only fully decodes the same
#        files with libjpeg-turbo (bench/decode_loop.cc: TurboJPEG, full size,
#        RGB, the bytes already in memory), built here with g++ -O2
# for T = 1 and 2. The folder: a few hundred distinct JPEGs of 300-600 px made
# from the colour photographs python3-skimage ships (bench/photo_folder.py,
# seeded: random crops and rescales, PIL quality 85-95), 8 classes. Legs run
# interleaved tv1 bd1 tv2 bd2 loop, ROUNDS times; each times about SECONDS
# after a warm-up (torchvision: 3 batches; batchdist: 1 batch; loop: one pass).
# Prints each round and the medians of samples/s and of the per-round ratios
# bd/tv at 1 and 2 threads (the issue's target: >= 2.0) and bd1/loop (the
# whole pipeline per thread against decoding alone; target >= 1.0).
# With T = 2 on a 2-core machine both sides also compete with their consumer
# (torchvision's main process; batchdist's consumer thread, nearly idle).
#
#   bench/loader_vs_torchvision.sh [BATCHDIST_BIN] [ROUNDS] [SECONDS] [PHOTO_DIR]
#     defaults: build/launcher/batchdist 5 8 (a temp folder of 400 photos);
#     PHOTO_DIR: use (or, if it does not exist, make) that folder instead
# Needs: apt-get install -y python3-skimage python3-pil python3-torchvision \
#   libjpeg-turbo-progs libturbojpeg0-dev g++
set -euo pipefail
bin=${1:-build/launcher/batchdist}
rounds=${2:-5}
secs=${3:-8}
photos=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3  # Debian's python3 (torch 1.13, torchvision 0.14, PIL 9.4)
need="apt-get install -y python3-skimage python3-pil python3-torchvision libjpeg-turbo-progs libturbojpeg0-dev g++"
"$py" -c 'import torchvision, PIL, skimage' 2>/dev/null ||
  { echo "loader_vs_torchvision.sh: needs Debian's python3 with torchvision, PIL and skimage: $need" >&2; exit 1; }
[ -f /usr/include/turbojpeg.h ] && command -v g++ >/dev/null ||
  { echo "loader_vs_torchvision.sh: needs turbojpeg.h and g++: $need" >&2; exit 1; }
[ -x "$bin" ] || { echo "loader_vs_torchvision.sh: no $bin (cmake --build build --target batchdist)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ -z "$photos" ]; then photos=$out/photos; fi
if [ ! -d "$photos/train" ]; then
  "$py" "$here/photo_folder.py" "$photos" --count 400 --seed 0
fi
files=("$photos"/train/*/*.jpg)
echo "photos: ${#files[@]} files, $(du -sh "$photos/train" | cut -f1) under $photos/train"
g++ -O2 -o "$out/decode_loop" "$here/decode_loop.cc" -lturbojpeg

cat >"$out/data.yaml" <<YAML
model: {name: cnn}
data: {name: image_folder, path: $photos, image_size: 224, workers: 1, val_fraction: 0}
batch: {global: 32, last_batch: drop}
train: {device: cpu}
YAML

tv() {  # T -> samples/s
  "$py" -W ignore "$here/torchvision_loader.py" "$photos" --workers "$1" --seconds "$secs" |
    awk '/samples_per_s/ { printf "%.1f\n", $2 }'
}
bd() {  # T -> samples/s
  "$bin" data "$out/data.yaml" --set data.workers="$1" --seconds "$secs" --json -q --output "$out/bd" \
    >"$out/bd.json"
  "$py" -c 'import json, sys; print("%.1f" % json.load(open(sys.argv[1]))["samples_per_s"])' "$out/bd.json"
}
loop() {
  "$out/decode_loop" "$secs" "${files[@]}" | awk '/images_per_s/ { printf "%.1f\n", $2 }'
}
ratio() { awk -v x="$1" -v y="$2" 'BEGIN { printf "%.2f", x / y }'; }
median() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "samples/s (images/s for the loop); $rounds rounds of ~${secs} s per leg"
printf "round  %8s  %8s  %8s  %8s  %8s   %6s  %6s  %8s\n" tv1 bd1 tv2 bd2 loop bd1/tv1 bd2/tv2 bd1/loop
T1=() B1=() T2=() B2=() L=() r1=() r2=() rl=()
for r in $(seq 1 "$rounds"); do
  t1=$(tv 1) b1=$(bd 1) t2=$(tv 2) b2=$(bd 2) l=$(loop)
  T1+=("$t1") B1+=("$b1") T2+=("$t2") B2+=("$b2") L+=("$l")
  r1+=("$(ratio "$b1" "$t1")") r2+=("$(ratio "$b2" "$t2")") rl+=("$(ratio "$b1" "$l")")
  printf "%5d  %8s  %8s  %8s  %8s  %8s   %7s  %7s  %8s\n" "$r" "$t1" "$b1" "$t2" "$b2" "$l" \
    "${r1[-1]}" "${r2[-1]}" "${rl[-1]}"
done
printf "median %8s  %8s  %8s  %8s  %8s   %7s  %7s  %8s\n" "$(median "${T1[@]}")" "$(median "${B1[@]}")" \
  "$(median "${T2[@]}")" "$(median "${B2[@]}")" "$(median "${L[@]}")" \
  "$(median "${r1[@]}")" "$(median "${r2[@]}")" "$(median "${rl[@]}")"
echo "median batchdist / torchvision (target >= 2.0): 1 thread $(median "${r1[@]}"), 2 threads $(median "${r2[@]}")"
echo "median batchdist 1 thread / decode-only loop (target >= 1.0): $(median "${rl[@]}")"
echo "batchdist's last run (2 threads): $("$py" -c 'import json, sys; r = json.load(open(sys.argv[1]))["per_rank"][0]; b = r["read_s"] + r["decode_s"] + r["transform_s"]; print("output %s, thread time: read %.0f%%, decode %.0f%%, transform %.0f%%" % (r["output"], 100 * r["read_s"] / b, 100 * r["decode_s"] / b, 100 * r["transform_s"] / b))' "$out/bd.json")"
uptime

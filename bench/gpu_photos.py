"""The photos step of bench/gpu_acceptance.sh: an image folder for the input-pipeline run.

  python3 bench/gpu_photos.py ROOT [--count 512] [--repeat 16] [--make-data BIN]
                               [--source auto|photos|patterns] [--fallback-python PATH]

--source auto (the default): real photos when it can: bench/photo_folder.py
(random crops of scikit-image's colour photographs, 300-600 px on the longer side,
JPEG quality 85-95, 8 classes), with scikit-image's data folder found in this
Python (pip's wheel ships the photos), SKIMAGE_DATA, or Debian's python3-skimage;
PIL and numpy are needed.
This Python lacking them, --fallback-python [/usr/bin/python3; '' for none] is
tried. Otherwise (an air-gapped node's torch environment often has neither) the
CUDA build's batchdist_make_data writes JPEGs of class patterns plus noise of
about the same size (--size 500x375, +-25 %): not photos, said in photos.json.
--source photos: photos or exit 1 saying what is missing; --source patterns: the
patterns whatever is installed. Which one auto takes depends on the machine, so
a test names the one it asserts about (tests/gpu_acceptance_test.sh).

ROOT/list.txt lists every image --repeat times ("train/<class>/<file> label"), the
data.list of the pipeline run: a long epoch from a few hundred distinct files, so
that epoch ends (the loader restarts) do not count as waiting for data; each
read is decoded and randomly cropped again. ROOT/photos.json says what was made.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def skimage_data():
    """scikit-image's data folder holding photo_folder.py's photos, or (None, why)."""
    tried = []
    if os.environ.get("SKIMAGE_DATA"):
        tried.append(os.environ["SKIMAGE_DATA"])
    spec = importlib.util.find_spec("skimage")
    if spec is not None and spec.submodule_search_locations:
        tried.append(os.path.join(list(spec.submodule_search_locations)[0], "data"))
    tried.append("/usr/lib/python3/dist-packages/skimage/data")
    return tried


def photos(root, count, seed):
    """Runs photo_folder.py; returns (generator, None) or (None, why not)."""
    try:
        import numpy  # noqa: F401
        import PIL  # noqa: F401
    except ImportError as e:
        return None, f"{sys.executable} has no {e.name} (photo_folder.py needs PIL and numpy)"
    spec = importlib.util.spec_from_file_location("photo_folder", os.path.join(HERE, "photo_folder.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    need = [f for files in mod.PHOTOS.values() for f in files]
    tried = skimage_data()
    found = next((d for d in tried if all(os.path.isfile(os.path.join(d, f)) for f in need)), None)
    if found is None:
        return None, "no scikit-image photos (" + ", ".join(need[:3]) + ", ...) in " + ", ".join(tried)
    mod.SKIMAGE_DATA = found
    argv = sys.argv
    sys.argv = ["photo_folder.py", root, "--count", str(count), "--seed", str(seed)]
    try:
        mod.main()
    finally:
        sys.argv = argv
    return f"bench/photo_folder.py (scikit-image's photos from {found})", None


def patterns(root, count, make_data):
    classes = 8
    subprocess.run([make_data, "image_folder", root, "--classes", str(classes),
                    "--train-per-class", str(max(1, count // classes)), "--size", "500x375",
                    "--png-every", "0", "--no-val", "--seed", "1"], check=True)
    return f"{make_data} image_folder --size 500x375 (class patterns plus noise, not photos)"


def jpeg_size(path):
    """(width, height) from a JPEG's SOF marker, without PIL."""
    with open(path, "rb") as f:
        data = f.read()
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if marker in (0xC0, 0xC1, 0xC2):
            return int.from_bytes(data[i + 7:i + 9], "big"), int.from_bytes(data[i + 5:i + 7], "big")
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--count", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--make-data", default="", help="batchdist_make_data, for patterns when there are no photos")
    ap.add_argument("--source", choices=("auto", "photos", "patterns"), default="auto",
                    help="photos, patterns, or photos where this machine can make them (auto)")
    ap.add_argument("--fallback-python", default="/usr/bin/python3",
                    help="the interpreter tried when this one cannot make photos ('' for none)")
    a = ap.parse_args()
    t0 = time.time()
    root = os.path.abspath(a.root)
    if a.source == "patterns":
        generator, why = None, "--source patterns"
    else:
        generator, why = photos(root, a.count, a.seed)
    fallback = a.fallback_python
    if generator is None and a.source != "patterns" and fallback and os.path.exists(fallback) \
            and os.path.realpath(sys.executable) != os.path.realpath(fallback) \
            and not os.environ.get("GPU_PHOTOS_REEXEC"):
        print(f"gpu_photos: {why}; trying {fallback}", flush=True)
        env = dict(os.environ, GPU_PHOTOS_REEXEC="1", GPU_PHOTOS_WHY=why)
        os.execve(fallback, [fallback, os.path.abspath(__file__)] + sys.argv[1:], env)
    if generator is None:
        why = "; ".join(w for w in (os.environ.get("GPU_PHOTOS_WHY"), why) if w)
        if a.source == "photos":
            sys.exit(f"gpu_photos: --source photos, but no photos: {why}")
        if not a.make_data or not os.access(a.make_data, os.X_OK):
            sys.exit(f"gpu_photos: no photos ({why}) and no batchdist_make_data (--make-data '{a.make_data}')")
        print(f"gpu_photos: no photos ({why}); writing patterns instead", flush=True)
        generator = patterns(root, a.count, a.make_data)
    train = os.path.join(root, "train")
    classes = sorted(d for d in os.listdir(train) if os.path.isdir(os.path.join(train, d)))
    files = []
    for label, cls in enumerate(classes):
        for dirpath, dirnames, names in os.walk(os.path.join(train, cls)):
            dirnames.sort()
            for n in sorted(names):
                if n.lower().endswith((".jpg", ".jpeg", ".png")):
                    files.append((os.path.relpath(os.path.join(dirpath, n), root), label))
    with open(os.path.join(root, "list.txt"), "w") as f:
        for _ in range(a.repeat):
            for path, label in files:
                f.write(f"{path} {label}\n")
    sizes = [s for s in (jpeg_size(os.path.join(root, p)) for p, _ in files) if s]
    info = {
        "source": "photos" if "photo_folder" in generator else "patterns",
        "generator": generator,
        "why_not_photos": why or None,
        "files": len(files),
        "classes": len(classes),
        "bytes": sum(os.path.getsize(os.path.join(root, p)) for p, _ in files),
        "longer_side_px": [min(max(s) for s in sizes), max(max(s) for s in sizes)] if sizes else None,
        "mean_mpx": round(sum(w * h for w, h in sizes) / len(sizes) / 1e6, 3) if sizes else None,
        "list": os.path.join(root, "list.txt"),
        "list_entries": len(files) * a.repeat,
        "repeat": a.repeat,
        "seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(root, "photos.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(f"gpu_photos: {info['files']} files ({info['source']}: {generator}), {info['classes']} classes, "
          f"{info['mean_mpx']} Mpx on average; {root}/list.txt: {info['list_entries']} entries")


if __name__ == "__main__":
    main()

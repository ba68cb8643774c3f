"""Makes an image folder of distinct JPEG photos for bench/loader_vs_torchvision.sh.

  /usr/bin/python3 bench/photo_folder.py ROOT [--count 400] [--seed 0]

ROOT/train/<class>/NNNN.jpg, one class per source photograph among the colour
photos Debian's python3-skimage ships (astronaut, chelsea, coffee, rocket, the
motorcycle pair, hubble_deep_field, ihc, retina). Each file is a random crop of
its photo (15-100% of the area, aspect 3:4 to 4:3), possibly mirrored, rescaled
to a longer side of 300-600 px (shorter side at least 225), slightly re-toned,
and saved with PIL at quality 85-95 (4:2:0, baseline): what a folder of
ordinary photos looks like to a decoder. Seeded: the same files every time.
"""
import argparse
import os
import random

import numpy as np
from PIL import Image, ImageEnhance

SKIMAGE_DATA = "/usr/lib/python3/dist-packages/skimage/data"
# class name -> photo file(s) in SKIMAGE_DATA
PHOTOS = {
    "astronaut": ["astronaut.png"],
    "chelsea": ["chelsea.png"],
    "coffee": ["coffee.png"],
    "rocket": ["rocket.jpg"],
    "motorcycle": ["motorcycle_left.png", "motorcycle_right.png"],
    "hubble": ["hubble_deep_field.jpg"],
    "ihc": ["ihc.png"],
    "retina": ["retina.jpg"],
}


def make_one(src, rng):
    w, h = src.size
    for _ in range(20):
        area = rng.uniform(0.15, 1.0) * w * h
        aspect = rng.uniform(3 / 4, 4 / 3)
        cw = int(round((area * aspect) ** 0.5))
        ch = int(round((area / aspect) ** 0.5))
        if cw <= w and ch <= h:
            break
    else:
        cw, ch = w, h
    x = rng.randint(0, w - cw)
    y = rng.randint(0, h - ch)
    img = src.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    longer = rng.randint(300, 600)
    scale = longer / max(cw, ch)
    nw, nh = max(1, round(cw * scale)), max(1, round(ch * scale))
    if min(nw, nh) < 225:  # keep both sides above the 224 crop (a real photo is)
        f = 225 / min(nw, nh)
        nw, nh = round(nw * f), round(nh * f)
    img = img.resize((nw, nh), Image.BICUBIC)
    img = ImageEnhance.Brightness(img).enhance(rng.uniform(0.85, 1.15))
    img = ImageEnhance.Color(img).enhance(rng.uniform(0.8, 1.2))
    return img


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--count", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    sources = {}
    for cls, files in PHOTOS.items():
        sources[cls] = []
        for f in files:
            img = Image.open(os.path.join(SKIMAGE_DATA, f)).convert("RGB")
            sources[cls].append(img)
    classes = sorted(sources)
    sizes = []
    for i in range(a.count):
        cls = classes[i % len(classes)]
        src = sources[cls][rng.randrange(len(sources[cls]))]
        img = make_one(src, rng)
        d = os.path.join(a.root, "train", cls)
        os.makedirs(d, exist_ok=True)
        img.save(os.path.join(d, "%04d.jpg" % i), quality=rng.randint(85, 95))
        sizes.append(img.size)
    px = np.array([w * h for w, h in sizes])
    print("%d JPEGs in %d classes under %s/train: %d-%d px on the longer side, %.2f Mpx on average"
          % (a.count, len(classes), a.root, min(max(s) for s in sizes), max(max(s) for s in sizes),
             px.mean() / 1e6))


if __name__ == "__main__":
    main()

"""torchvision's side of bench/loader_vs_torchvision.sh: ImageFolder + DataLoader
with RandomResizedCrop(224), RandomHorizontalFlip and uint8 output (PILToTensor,
as batchdist ships uint8 HWC), batch 32, shuffle, drop_last, persistent workers,
torch.set_num_threads(1) in the main process and in each worker.

  /usr/bin/python3 bench/torchvision_loader.py ROOT --workers T --seconds S

Warms up with `--warmup` batches (the workers' start-up and first files), then
times batches for about S seconds (whole epochs are restarted as needed, which
persistent workers make cheap) and prints "samples_per_s N".
"""
import argparse
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def init_worker(_):
    torch.set_num_threads(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.PILToTensor(),
    ])
    ds = datasets.ImageFolder(a.root + "/train", transform=tf)
    dl = DataLoader(ds, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=a.workers,
                    persistent_workers=a.workers > 0, worker_init_fn=init_worker)
    samples = 0
    warm = 0
    t0 = None
    elapsed = 0.0
    while True:
        for x, _ in dl:
            if warm < a.warmup:
                warm += 1
                if warm == a.warmup:
                    t0 = time.perf_counter()
                continue
            assert x.dtype == torch.uint8
            samples += x.shape[0]
            elapsed = time.perf_counter() - t0
            if elapsed >= a.seconds:
                break
        if t0 is not None and elapsed >= a.seconds:
            break
    print("samples_per_s %.1f" % (samples / elapsed))
    print("samples %d" % samples)
    print("seconds %.3f" % elapsed)


if __name__ == "__main__":
    main()

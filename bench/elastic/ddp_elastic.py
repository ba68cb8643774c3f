#!/usr/bin/env python3
"""Plain DDP training, written the way torchrun (elastic) users write it.

The torchrun side of bench/elastic.sh: the quickstart's MLP shape without
BatchNorm (64 -> 128 -> 64 -> 10, ReLU), SGD, a fixed batch of 24 per process
(so the global batch is 24 x world and changes with the world), a
DistributedSampler over the digits CSV, the same 20 ms added to every step as
batchdist's BATCHDIST_FAULT_SLOW_UPDATE_US=20000, and torch elastic's documented
fault-tolerance pattern: a checkpoint every --every steps to a shared directory
(written to a temporary file, then os.replace), and at start a resume from the
newest one.

Process group: init_process_group("gloo") from torchrun's environment with the
default timeout (30 min in torch 1.13), as users write it.

Rank 0 prints, flushed:
  START <unix time> world=W G=G resumed_from=S restart=R   once per (re)start
  STEP <unix time> step=S world=W G=G loss=L              once per step
  CKPT <unix time> step=S                                 after each checkpoint
"""
import argparse
import glob
import gzip
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def load_digits(path, val_fraction, seed):
    """64 pixel values (0-16) then the label (0-9), comma-separated, per line."""
    with gzip.open(path, "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x = rows[:, :64] / 16.0
    y = rows[:, 64].astype(np.int64)
    order = np.random.RandomState(seed).permutation(len(rows))
    n_train = len(rows) - int(round(len(rows) * val_fraction))
    train = order[:n_train]
    return TensorDataset(torch.from_numpy(x[train]), torch.from_numpy(y[train]))


def newest_checkpoint(directory):
    files = sorted(glob.glob(os.path.join(directory, "step-*.pt")))
    return files[-1] if files else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="digits CSV (.gz)")
    ap.add_argument("--ckpt-dir", required=True, help="shared checkpoint directory")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch", type=int, default=24, help="per-process batch")
    ap.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    ap.add_argument("--sleep-ms", type=float, default=20.0, help="added to every step")
    ap.add_argument("--lr", type=float, default=0.05, help="at batch 64, scaled linearly")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # MASTER_ADDR/PORT, RANK, WORLD_SIZE from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    global_batch = args.batch * world

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                          nn.Linear(64, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr * global_batch / 64, momentum=0.9,
                          weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    data = load_digits(args.data, 0.2, args.seed)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, drop_last=True)

    step, epoch, samples_done = 0, 0, 0  # samples of this epoch already trained on
    path = newest_checkpoint(args.ckpt_dir)
    if path:
        ckpt = torch.load(path, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        for group in opt.param_groups:  # the lr follows the new global batch
            group["lr"] = args.lr * global_batch / 64
        step, epoch, samples_done = ckpt["step"], ckpt["epoch"], ckpt["samples_done"]
    if rank == 0:
        print(f"START {time.time():.3f} world={world} G={global_batch} resumed_from={step} "
              f"restart={os.environ.get('TORCHELASTIC_RESTART_COUNT', '?')} "
              f"checkpoint={path or 'none'}", flush=True)

    sleep_s = args.sleep_ms / 1000.0
    while epoch < args.epochs:
        sampler.set_epoch(epoch)
        skip = samples_done // global_batch  # batches of this epoch done before a resume
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            time.sleep(sleep_s)
            step += 1
            samples_done = (i + 1) * global_batch
            if rank == 0:
                print(f"STEP {time.time():.3f} step={step} world={world} G={global_batch} "
                      f"loss={loss.item():.4f}", flush=True)
                if step % args.every == 0:
                    tmp = os.path.join(args.ckpt_dir, f"tmp-{os.getpid()}-{step}.pt")
                    torch.save({"model": model.state_dict(), "optim": opt.state_dict(),
                                "step": step, "epoch": epoch, "samples_done": samples_done,
                                "world": world}, tmp)
                    os.replace(tmp, os.path.join(args.ckpt_dir, f"step-{step:08d}.pt"))
                    print(f"CKPT {time.time():.3f} step={step}", flush=True)
        epoch += 1
        samples_done = 0
    if rank == 0:
        print(f"DONE {time.time():.3f} step={step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

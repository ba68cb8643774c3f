"""Baseline for bench/vs_ddp.sh: PyTorch DDP (gloo, CPU) on the same workload
batchdist trains there. Prints 'samples_per_s N' (all ranks, timed steps only).

Needs Debian's python3-torch (the same libtorch 1.13 batchdist links). Started by
the same mpirun as batchdist (rank and size from Open MPI's environment):
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29511 python3 bench/ddp_baseline.py
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, nargs="+", default=[512, 512])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()

    if "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(0)
    centres = torch.randn(args.classes, args.dim)
    y = torch.randint(args.classes, (args.samples,))
    x = centres[y] + 0.5 * torch.randn(args.samples, args.dim)

    layers, width = [], args.dim
    for h in args.hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers, nn.Linear(width, args.classes)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    per_rank = args.global_batch // world
    g = torch.Generator().manual_seed(1)
    perm = torch.randperm(args.samples, generator=g)

    def step(i: int) -> None:
        start = (i * args.global_batch + rank * per_rank) % (args.samples - per_rank)
        idx = perm[start:start + per_rank]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(args.warmup + i)
    dist.barrier()
    secs = time.perf_counter() - t0
    if rank == 0:
        print(f"samples_per_s {args.steps * args.global_batch / secs:.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

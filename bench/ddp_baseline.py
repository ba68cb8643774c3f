"""PyTorch DDP baseline for bench/vs_ddp.sh and bench/gpu_acceptance.sh: the
workload batchdist trains there, written in plain PyTorch. Prints
'samples_per_s N' (all ranks, timed steps only).

  --model mlp (default): MLP 256-512-512-10 on synthetic data, gloo on the CPU
    (vs_ddp.sh). Started by the same mpirun as batchdist, rank and size from Open
    MPI's environment:
      mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29511 python3 bench/ddp_baseline.py
  --model resnet50 --device cuda: the ResNet-50 of worker/model.cc (ImageNet stem,
    stride in the 3x3 conv of each bottleneck) on synthetic 3x32x32 uint8 images
    resized to 224 on the GPU, nccl, --precision fp32/bf16/fp16 (autocast; fp16
    with a GradScaler), SGD with momentum and weight decay (gpu_acceptance.sh):
      torchrun --standalone --nproc_per_node 8 bench/ddp_baseline.py --model resnet50 \\
        --device cuda --precision bf16 --per-gpu-batch 128
    The images are made on the GPU, so this baseline never waits for data.

Runs with any torch that has torch.distributed: Debian's python3-torch (1.13)
or the venv of tests/cuda_leg.sh (2.x).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or cin != out:
            self.down = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


def resnet50(classes: int) -> nn.Module:
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, (width, blocks) in enumerate(zip([64, 128, 256, 512], [3, 4, 6, 3])):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, (1 if i == 0 else 2) if b == 0 else 1))
            cin = width * Bottleneck.expansion
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "resnet50"], default="mlp")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, nargs="+", default=[512, 512])
    ap.add_argument("--batchnorm", action="store_true", help="mlp: Linear-BatchNorm1d-ReLU blocks")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--per-gpu-batch", type=int, default=0, help="overrides --global-batch")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()

    if "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
        os.environ.setdefault("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(0)
    per_rank = args.per_gpu_batch or args.global_batch // world
    global_batch = per_rank * world

    if args.model == "mlp":
        centres = torch.randn(args.classes, args.dim)
        y = torch.randint(args.classes, (args.samples,))
        x = centres[y] + 0.5 * torch.randn(args.samples, args.dim)
        x, y = x.to(device), y.to(device)
        layers, width = [], args.dim
        for h in args.hidden:
            layers += [nn.Linear(width, h)] + ([nn.BatchNorm1d(h)] if args.batchnorm else []) + [nn.ReLU()]
            width = h
        net = nn.Sequential(*layers, nn.Linear(width, args.classes))
        opt_args = dict(lr=0.05, momentum=0.9, weight_decay=args.weight_decay)
    else:
        g = torch.Generator(device=device).manual_seed(rank)
        x = torch.randint(0, 256, (per_rank, 3, 32, 32), dtype=torch.uint8, device=device, generator=g)
        y = torch.randint(0, args.classes, (per_rank,), device=device, generator=g)
        net = resnet50(args.classes)
        opt_args = dict(lr=0.1, momentum=0.9, weight_decay=1e-4)
    model = nn.parallel.DistributedDataParallel(net.to(device),
                                                device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), **opt_args)
    loss_fn = nn.CrossEntropyLoss()
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = None
    if args.precision == "fp16":  # torch.amp.GradScaler since 2.3; the cuda.amp one warns there
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()
    perm = torch.randperm(args.samples, generator=torch.Generator().manual_seed(1)).to(device)

    def batch(i: int):
        if args.model == "mlp":
            start = (i * global_batch + rank * per_rank) % (args.samples - per_rank)
            idx = perm[start:start + per_rank]
            return x[idx], y[idx]
        # As batchdist's synthetic_images: uint8 -> float, resize, normalise, on the device.
        img = F.interpolate(x.float() / 255.0, size=(args.image_size, args.image_size),
                            mode="bilinear", align_corners=False)
        return (img - 0.5) / 0.25, y

    def step(i: int) -> None:
        inputs, labels = batch(i)
        opt.zero_grad(set_to_none=True)
        if low is not None:
            with torch.autocast(device_type=device.type, dtype=low):
                loss = loss_fn(model(inputs), labels)
        else:
            loss = loss_fn(model(inputs), labels)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    for i in range(args.warmup):
        step(i)
    sync()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(args.warmup + i)
    sync()
    secs = time.perf_counter() - t0
    if rank == 0:
        print(f"samples_per_s {args.steps * global_batch / secs:.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

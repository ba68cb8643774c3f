"""PyTorch DDP baseline for bench/vs_ddp.sh and bench/gpu_acceptance.sh: the
workload batchdist trains there, written in plain PyTorch. Prints
'samples_per_s N' (all ranks, timed steps only), and for a token model
'tokens_per_s N' too. On CUDA also the model FLOPs utilisation, when the model's
FLOPs and the GPU's peak are known:
  flops_per_sample F    forward and backward, per sample: the GPT's 6 N + 12 L H Q T
                        per token (PaLM, appendix B; N the parameters less the
                        position embedding, as nanoGPT's estimate_mfu) x seq_len;
                        ResNet-50's counted by torch.utils.flop_counter on 2 samples
  peak_tflops P (S)     the GPU's dense bf16/fp16 tensor peak from the table below
                        (S: where it came from), or --peak-tflops; none for fp32
  mfu M                 samples/s x F / (P x 1e12 x world size), 0..1

  --model mlp (default): MLP 256-512-512-10 on synthetic data, gloo on the CPU
    (vs_ddp.sh). Started by the same mpirun as batchdist, rank and size from Open
    MPI's environment:
      mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29511 python3 bench/ddp_baseline.py
  --model resnet50 --device cuda: the ResNet-50 of worker/model.cc (ImageNet stem,
    stride in the 3x3 conv of each bottleneck) on synthetic 3x32x32 uint8 images
    resized to 224 on the GPU, nccl, --precision fp32/bf16/fp16 (autocast; fp16
    with a GradScaler), SGD with momentum and weight decay (gpu_acceptance.sh):
      torchrun --standalone --nproc_per_node 8 bench/ddp_baseline.py --model resnet50 \\
        --device cuda --precision bf16 --per-gpu-batch 128 [--channels-last]
    The images are made on the GPU, so this baseline never waits for data.
    --channels-last: the model and its input in torch.channels_last (NHWC), as
    batchdist's train.memory_format: channels_last.
  --model gpt --tokens FILE.bin: batchdist's model.name: gpt (bench/gpt_model.py,
    nanoGPT's shape; --layers --heads --embed --vocab --seq-len --dropout) on the
    token windows of FILE.bin (uint16, memory-mapped; a new permutation each
    epoch), AdamW (--lr --beta1 --beta2 --eps --weight-decay; --clip-grad-norm as
    optim.clip_grad_norm), gloo on the CPU (vs_ddp.sh's GPT leg), started like the
    MLP; or with --device cuda under torchrun, nccl (gpu_acceptance.sh's GPT-2
    small: attention by scaled_dot_product_attention, no torch.compile).

Runs with any torch that has torch.distributed: Debian's python3-torch (1.13)
or the venv of tests/cuda_leg.sh (2.x).
"""
import argparse
import os
import time
from typing import Callable, Iterable, NamedTuple, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import gpt_model  # bench/gpt_model.py, beside this file


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


class Workload(NamedTuple):
    """What differs between the models: the network, its optimizer, step i's batch
    on this rank, the loss, the tokens in a sample (0: not a token model), and the
    model's forward and backward FLOPs per sample (0: not known)."""
    net: nn.Module
    optimizer: Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]
    batch: Callable[[int], Tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    tokens_per_sample: int = 0
    flops_per_sample: float = 0.0


def mlp_workload(args, rank: int, per_rank: int, device: torch.device) -> Workload:
    torch.manual_seed(0)
    centres = torch.randn(args.classes, args.dim)
    y = torch.randint(args.classes, (args.samples,))
    x = centres[y] + 0.5 * torch.randn(args.samples, args.dim)
    x, y = x.to(device), y.to(device)
    layers, width = [], args.dim
    for h in args.hidden:
        layers += [nn.Linear(width, h)] + ([nn.BatchNorm1d(h)] if args.batchnorm else []) + [nn.ReLU()]
        width = h
    net = nn.Sequential(*layers, nn.Linear(width, args.classes))
    perm = torch.randperm(args.samples, generator=torch.Generator().manual_seed(1)).to(device)
    global_batch = per_rank * dist.get_world_size()

    def batch(i: int):
        start = (i * global_batch + rank * per_rank) % (args.samples - per_rank)
        idx = perm[start:start + per_rank]
        return x[idx], y[idx]

    sgd = lambda params: torch.optim.SGD(params, lr=args.lr or 0.05, momentum=0.9,
                                         weight_decay=args.weight_decay)
    return Workload(net, sgd, batch, nn.CrossEntropyLoss())


def resnet50_workload(args, rank: int, per_rank: int, device: torch.device) -> Workload:
    torch.manual_seed(0)
    g = torch.Generator(device=device).manual_seed(rank)
    x = torch.randint(0, 256, (per_rank, 3, 32, 32), dtype=torch.uint8, device=device, generator=g)
    y = torch.randint(0, args.classes, (per_rank,), device=device, generator=g)

    fmt = torch.channels_last if args.channels_last else torch.contiguous_format

    def batch(i: int):
        # As batchdist's synthetic_images: uint8 -> float, resize, normalise, on the device.
        img = F.interpolate(x.float() / 255.0, size=(args.image_size, args.image_size),
                            mode="bilinear", align_corners=False)
        return ((img - 0.5) / 0.25).contiguous(memory_format=fmt), y

    net = resnet50(args.classes).to(device, memory_format=fmt)
    sgd = lambda params: torch.optim.SGD(params, lr=args.lr or 0.1, momentum=0.9, weight_decay=1e-4)
    loss = nn.CrossEntropyLoss()
    flops = counted_flops(net, batch, loss) if device.type == "cuda" else 0.0
    return Workload(net, sgd, batch, loss, flops_per_sample=flops)


def counted_flops(net: nn.Module, batch, loss) -> float:
    """Forward and backward FLOPs per sample, counted by torch.utils.flop_counter
    (torch >= 2.1) on 2 samples of `batch`; 0 where this torch has no counter."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return 0.0
    x, y = batch(0)
    counter = FlopCounterMode(display=False)
    with counter:
        loss(net(x[:2]), y[:2]).backward()
    net.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 2.0


def gpt_flops_per_token(net: nn.Module, args) -> float:
    """PaLM's appendix B: 6 N + 12 L H Q T per token, N the parameters less the
    position embedding (as nanoGPT's estimate_mfu; the token embedding is the head)."""
    n = sum(p.numel() for p in net.parameters()) - net.wpe.weight.numel()
    return 6.0 * n + 12.0 * args.layers * args.heads * (args.embed // args.heads) * args.seq_len


# Dense (no sparsity) tensor-core TFLOPS of NVIDIA's datasheets in bf16 and fp16,
# by a piece of the device's name, the first that matches; fp32 has none here.
PEAK_TFLOPS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H200 NVL", 835.0), ("GH200", 989.4),
               ("H100", 989.4), ("H200", 989.4), ("H800", 989.4), ("A100", 312.0), ("L40S", 362.0),
               ("A10G", 70.0), ("L4", 121.0)]


def peak_tflops(args, device: torch.device) -> Tuple[float, str]:
    """(the peak, where it came from); (0, why not) when unknown."""
    if args.peak_tflops:
        return args.peak_tflops, "--peak-tflops"
    if device.type != "cuda":
        return 0.0, "not a GPU"
    name = torch.cuda.get_device_name(device)
    if args.precision == "fp32":
        return 0.0, f"{name}: no fp32 peak in ddp_baseline.py's table"
    for key, tflops in PEAK_TFLOPS:
        if key in name:
            return tflops, f"{name}: dense {args.precision} tensor peak (ddp_baseline.py's table, '{key}')"
    return 0.0, f"{name}: not in ddp_baseline.py's table"


def gpt_workload(args, rank: int, per_rank: int, device: torch.device) -> Workload:
    """bench/gpt_model.py's GPT on the windows of --tokens, a new permutation each
    epoch (the last partial batch dropped), AdamW as batchdist's optim.name: adamw
    (decay on weights of 2 or more dimensions only, as worker/model/optimizer.cc and
    nanoGPT's configure_optimizers), the mean token
    cross-entropy (nanoGPT's loss)."""
    if not args.tokens:
        raise SystemExit("--model gpt needs --tokens FILE.bin")
    torch.manual_seed(0)
    net = gpt_model.from_args(args)
    flops = gpt_flops_per_token(net, args) * args.seq_len
    data = gpt_model.TokenWindows(args.tokens, args.seq_len)
    global_batch = per_rank * dist.get_world_size()
    steps_per_epoch = data.count // global_batch
    if steps_per_epoch < 1:
        raise SystemExit(f"{args.tokens}: {data.count} windows, fewer than one global batch of {global_batch}")
    perms = {}

    def batch(i: int):
        epoch, k = divmod(i, steps_per_epoch)
        if epoch not in perms:
            perms.clear()
            perms[epoch] = torch.randperm(data.count, generator=torch.Generator().manual_seed(epoch))
        start = k * global_batch + rank * per_rank
        x, y = data.batch(perms[epoch][start:start + per_rank])
        return x.to(device), y.to(device)

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))

    def adamw(params):
        params = list(params)
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=args.lr or 1e-3, betas=(args.beta1, args.beta2), eps=args.eps)
    return Workload(net, adamw, batch, loss, tokens_per_sample=args.seq_len, flops_per_sample=flops)


WORKLOADS = {"mlp": mlp_workload, "resnet50": resnet50_workload, "gpt": gpt_workload}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(WORKLOADS), default="mlp")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, nargs="+", default=[512, 512])
    ap.add_argument("--batchnorm", action="store_true", help="mlp: Linear-BatchNorm1d-ReLU blocks")
    ap.add_argument("--lr", type=float, default=None, help="[mlp 0.05, resnet50 0.1, gpt 0.001]")
    ap.add_argument("--weight-decay", type=float, default=0.0, help="mlp and gpt (resnet50: 1e-4)")
    ap.add_argument("--beta1", type=float, default=0.9, help="gpt: AdamW")
    ap.add_argument("--beta2", type=float, default=0.999, help="gpt: AdamW")
    ap.add_argument("--eps", type=float, default=1e-8, help="gpt: AdamW")
    ap.add_argument("--clip-grad-norm", type=float, default=0.0,
                    help="clip the gradient's global norm to this before each step (0: no clipping)")
    ap.add_argument("--tokens", help="gpt: the uint16 .bin of token ids (batchdist_make_data tokens)")
    gpt_model.shape_args(ap)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--channels-last", action="store_true",
                    help="resnet50: the model and its input in torch.channels_last")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="the GPU's peak for the MFU [ddp_baseline.py's table by device name]")
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--per-gpu-batch", type=int, default=0, help="overrides --global-batch")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
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
    per_rank = args.per_gpu_batch or args.global_batch // world
    global_batch = per_rank * world

    work = WORKLOADS[args.model](args, rank, per_rank, device)
    model = nn.parallel.DistributedDataParallel(work.net.to(device),
                                                device_ids=[device.index] if cuda else None)
    opt = work.optimizer(model.parameters())
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = None
    if args.precision == "fp16":  # torch.amp.GradScaler since 2.3; the cuda.amp one warns there
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()

    def step(i: int) -> None:
        inputs, targets = work.batch(i)
        opt.zero_grad(set_to_none=True)
        if low is not None:
            with torch.autocast(device_type=device.type, dtype=low):
                loss = work.loss(model(inputs), targets)
        else:
            loss = work.loss(model(inputs), targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            if args.clip_grad_norm > 0:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if args.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
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
        samples_per_s = args.steps * global_batch / secs
        print(f"samples_per_s {samples_per_s:.1f}")
        if work.tokens_per_sample:
            print(f"tokens_per_s {samples_per_s * work.tokens_per_sample:.1f}")
        if cuda and work.flops_per_sample:
            peak, source = peak_tflops(args, device)
            print(f"flops_per_sample {work.flops_per_sample:.6g}")
            if peak:
                print(f"peak_tflops {peak:g} ({source})")
                print(f"mfu {samples_per_s * work.flops_per_sample / (peak * 1e12 * world):.4f}")
            else:
                print(f"mfu unknown ({source})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

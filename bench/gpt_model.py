"""batchdist's model.name: gpt written for PyTorch, in nanoGPT's shape (model.py),
for bench/ddp_baseline.py --model gpt. It matches worker/model/gpt.cc (Note [gpt]
in worker/model/gpt.h) module for module, so the two train the same network:
  - the same parameters under the same names and shapes (wte, wpe,
    h.<i>.ln_1, .attn.c_attn, .attn.c_proj, .ln_2, .mlp.c_fc, .mlp.c_proj, ln_f;
    Linear's [out, in]; the head tied to wte, no weight of its own);
  - GPT-2's initialisation: Linear and Embedding weights N(0, 0.02), biases 0,
    LayerNorm 1 and 0, the residual projections N(0, 0.02 / sqrt(2 layers));
  - GELU with the tanh approximation, dropout where gpt.cc has it;
  - attention as compat::causalAttention (Note [causal attention]): the fused
    scaled_dot_product_attention where this torch has it (2.x), else the explicit
    product with the mask built per call (1.13).
Differences from nanoGPT's model.py: GELU's tanh form (nanoGPT: exact), biases
everywhere (nanoGPT: optional), the explicit attention's mask made per call
(nanoGPT: a buffer), no generate(); the head is F.linear(x, wte.weight) rather
than a Linear sharing wte's weight (the same parameters and product).

Token windows (TokenWindows) read the `.bin` of uint16 ids that
batchdist_make_data tokens and nanoGPT's prepare scripts write, memory-mapped,
as data.name: tokens does (Note [tokens] in worker/data/data.h): window i is
tokens [i T, i T + T] (T + 1 ids: the input and the next-token target).

  python3 bench/gpt_model.py --check RUN/model.pt --layers 2 --heads 2 --embed 64 \\
      --vocab 256 --seq-len 64
prints whether this GPT's parameters (names and shapes) are those of a model.pt
that batchdist wrote for the same shape, and their count.
"""
import argparse
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02  # Note [gpt]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """compat::causalAttention: q, k, v [N, H, T, D] -> [N, H, T, D]."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    scores = torch.matmul(q, k.transpose(-2, -1))
    scores.mul_(1.0 / math.sqrt(q.size(-1)))  # in place, as compat::causalAttentionExplicit
    future = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).triu(1)
    weights = torch.softmax(scores.masked_fill_(future, float("-inf")), -1)
    if dropout_p > 0:
        weights = F.dropout(weights, dropout_p, training=True)
    return torch.matmul(weights, v)


class CausalSelfAttention(nn.Module):
    def __init__(self, embed: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.c_attn = nn.Linear(embed, 3 * embed)
        self.c_proj = nn.Linear(embed, embed)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, e = x.shape
        # [N, T, 3E] -> [3, N, H, T, D]: q, k and v, head-major.
        qkv = self.c_attn(x).view(n, t, 3, self.heads, e // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y = causal_attention(q, k, v, self.dropout if self.training else 0.0)
        return self.resid_drop(self.c_proj(y.transpose(1, 2).reshape(n, t, e)))


class Mlp(nn.Module):
    def __init__(self, embed: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(embed, 4 * embed)
        self.c_proj = nn.Linear(4 * embed, embed)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, embed: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(embed)
        self.attn = CausalSelfAttention(embed, heads, dropout)
        self.ln_2 = nn.LayerNorm(embed)
        self.mlp = Mlp(embed, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token ids [N, T] (T <= seq_len) -> logits [N, T, vocab]."""

    def __init__(self, layers: int, heads: int, embed: int, vocab: int, seq_len: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, embed)
        self.wpe = nn.Embedding(seq_len, embed)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(embed, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embed)
        self._initialise(layers)

    def _initialise(self, layers: int) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, INIT_STD)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, INIT_STD)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for block in self.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, 0.0, INIT_STD / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


class TokenWindows:
    """The non-overlapping windows of seq_len + 1 tokens of a uint16 `.bin`, memory-mapped."""

    def __init__(self, path: str, seq_len: int) -> None:
        ids = os.path.getsize(path) // 2
        # int16 holds the uint16 bits (1.13 has no uint16); batch() masks them back.
        self.tokens = torch.from_file(path, shared=False, size=ids, dtype=torch.int16)
        self.seq_len = seq_len
        self.count = (ids - 1) // seq_len
        if self.count < 1:
            raise SystemExit(f"{path}: {ids} tokens, fewer than one window of {seq_len} + 1")
        self.offsets = torch.arange(seq_len + 1)

    def batch(self, windows: torch.Tensor):
        """Window indices [n] -> (inputs [n, T], next-token targets [n, T]), int64."""
        w = self.tokens[windows[:, None] * self.seq_len + self.offsets].long() & 0xFFFF
        return w[:, :-1], w[:, 1:]


def shape_args(ap: argparse.ArgumentParser) -> None:
    """The model.* keys of Note [gpt] as options (ddp_baseline.py's too)."""
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--embed", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--dropout", type=float, default=0.0)


def from_args(args: argparse.Namespace) -> GPT:
    return GPT(args.layers, args.heads, args.embed, args.vocab, args.seq_len, args.dropout)


def check(model: GPT, model_pt: str) -> str:
    """One line: whether `model` has the parameters (names, shapes) of batchdist's model.pt."""
    theirs = {n: tuple(p.shape) for n, p in torch.jit.load(model_pt).named_parameters()}
    ours = {n: tuple(p.shape) for n, p in model.named_parameters()}
    count = sum(math.prod(s) for s in ours.values())
    if ours == theirs:
        return f"PyTorch GPT = batchdist's model.pt: {len(ours)} tensors, {count:,} parameters"
    diff = sorted(set(ours.items()) ^ set(theirs.items()))
    return (f"PyTorch GPT ({count:,} parameters) differs from batchdist's model.pt "
            f"({sum(math.prod(s) for s in theirs.values()):,}): {diff[:6]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="compare with a batchdist model.pt")
    ap.add_argument("--check", required=True, metavar="MODEL_PT")
    shape_args(ap)
    a = ap.parse_args()
    print(check(from_args(a), a.check))

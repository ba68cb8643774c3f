"""Makes the TorchScript modules with their own loss that the tests train from C++
(task module_loss, Note [module loss] in worker/task/task.cc): forward(x, target)
returns the loss, so batchdist trains the module as it is.

Run with Debian's python3-torch (apt-get install python3-torch), so that the files
load in LibTorch 1.13 and 2.x alike:
    /usr/bin/python3 tests/data/make_loss_modules.py tests/data
It writes three small modules (a few KB each):
  regression_loss.pt  24 features -> 3 values; returns a dict: "loss", the
                      per-sample mean squared error [N], and "mae", the batch's
                      mean absolute error (a metric). Targets N x 3 or any
                      N x ... of 3 values (reshaped).
  mean_loss.pt        the same network, returning only the batch's mean squared
                      error (a 0-d tensor): refused where padding needs weights.
  lm_loss.pt          a byte-level bigram language model (vocab 256): token
                      windows [N, T] in, a tuple out: the per-window mean token
                      cross-entropy [N] and the batch's token accuracy (metric_1).
"""
import os
import sys
from typing import Dict, Tuple

import torch
from torch import nn
from torch.nn import functional as F


def regression_net() -> nn.Module:
    return nn.Sequential(nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 3))


class RegressionLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = regression_net()

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> Dict[str, torch.Tensor]:
        out = self.net(x.flatten(1))
        err = out - target.reshape(out.shape[0], -1)
        # One loss per sample (reduction='none', then a mean over the values):
        # batchdist weighs them (padding weighs 0).
        return {"loss": err.square().mean(1), "mae": err.abs().mean()}


class MeanLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = regression_net()

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = self.net(x.flatten(1))
        return F.mse_loss(out, target.reshape(out.shape[0], -1))  # a mean: no weights possible


class BigramLm(nn.Module):
    def __init__(self, vocab: int = 256, embed: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.head = nn.Linear(embed, vocab)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.embed(x))  # [N, T, vocab]
        n, vocab = logits.shape[0], logits.shape[-1]
        tokens = F.cross_entropy(logits.reshape(-1, vocab).float(), target.reshape(-1),
                                 reduction="none")
        accuracy = (logits.argmax(-1) == target).float().mean()
        return tokens.view(n, -1).mean(1), accuracy


if __name__ == "__main__":
    out = sys.argv[1]
    for name, module in (("regression_loss.pt", RegressionLoss),
                         ("mean_loss.pt", MeanLoss),
                         ("lm_loss.pt", BigramLm)):
        torch.manual_seed(0)
        torch.jit.script(module()).save(os.path.join(out, name))

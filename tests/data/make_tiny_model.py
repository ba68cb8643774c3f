"""Makes tiny_cnn.pt, the TorchScript model the tests train from C++.

Run with Debian's python3-torch (apt-get install python3-torch):
    /usr/bin/python3 tests/data/make_tiny_model.py tests/data/tiny_cnn.pt
A small CNN with BatchNorm for 1x8x8 inputs (the digits) and 10 classes, saved
with torch.jit.script so that C++ can train it (parameters, buffers, train/eval).
"""
import sys

import torch
from torch import nn


class TinyCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.max_pool2d(x, 2)
        return self.head(torch.flatten(x, 1))


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.jit.script(TinyCnn()).save(sys.argv[1])

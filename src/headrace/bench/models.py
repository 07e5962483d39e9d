"""Small models for the training benchmark (``headrace train``), in plain torch.

torchvision is not a dependency, so the networks the papers train on these workloads are
written here, scaled down: a ResNet for the imagenet workload (224 × 224 RGB, 10 classes), a
3D U-Net for imseg (40³ patches, 3 classes: background, kidney, tumor) and an LSTM encoder for
speech (RNN-T's encoder without its prediction and joint networks). Sizes are set by ``width``
so the same code makes a CPU-sized model for the smoke test and a GPU-sized one.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class BasicBlock(nn.Module):
    """ResNet's two 3 × 3 convolutions with a shortcut (a 1 × 1 projection when shapes change)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNet(nn.Module):
    """A ResNet-18-shaped classifier: stem, four stages of ``blocks`` blocks, linear head.

    ``width``: channels of the first stage (64 in ResNet-18); stages double it.
    """

    def __init__(self, classes: int = 10, width: int = 32, blocks: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        layers: list[nn.Module] = []
        cin = width
        for stage in range(4):
            cout = width * 2**stage
            for b in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


def _double_conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv3d(cin, cout, 3, padding=1, bias=False), nn.InstanceNorm3d(cout, affine=True),
        nn.LeakyReLU(0.01),
        nn.Conv3d(cout, cout, 3, padding=1, bias=False), nn.InstanceNorm3d(cout, affine=True),
        nn.LeakyReLU(0.01),
    )


class UNet3D(nn.Module):
    """A 3D U-Net (MLPerf's model, shallower): ``depth`` down/up levels, skip connections.

    ``width``: channels of the first level (32 in MLPerf); levels double it. Input sides must
    be divisible by ``2 ** depth`` (40³ patches: depth ≤ 3).
    """

    def __init__(self, classes: int = 3, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        chans = [width * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList([_double_conv(1, chans[0])])
        self.down.extend(_double_conv(chans[i], chans[i + 1]) for i in range(depth))
        self.up = nn.ModuleList(nn.ConvTranspose3d(chans[i + 1], chans[i], 2, 2)
                                for i in reversed(range(depth)))
        self.merge = nn.ModuleList(_double_conv(2 * chans[i], chans[i])
                                   for i in reversed(range(depth)))
        self.head = nn.Conv3d(chans[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else F.max_pool3d(x, 2))
            skips.append(x)
        skips.pop()
        for up, merge in zip(self.up, self.merge, strict=True):
            x = merge(torch.cat([up(x), skips.pop()], dim=1))
        return self.head(x)


class SpeechLSTM(nn.Module):
    """RNN-T's encoder shape (a stack of LSTMs over spliced filterbank frames) with a classifier.

    Input ``(batch, frames, features)``: the speech workload's ``(100, 240)``. A linear
    projection to ``width``, ``layers`` LSTM layers of ``width`` units (MLPerf's RNN-T: 5 of
    1024), the mean over frames, a linear head to ``classes``. The LSTM runs its frames one
    after the other, so a step's time grows with frames × layers as in the real model.
    """

    def __init__(self, classes: int, width: int = 1024, layers: int = 5,
                 features: int = 240) -> None:
        super().__init__()
        self.proj = nn.Linear(features, width)
        self.lstm = nn.LSTM(width, width, layers, batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(self.proj(x))
        return self.head(y.mean(dim=1))

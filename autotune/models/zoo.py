"""Built-in architectures, defined in code with seeded random weights.

No weights can be downloaded on the machines this runs on, and latency does not
depend on weight values, so each entry builds its network from scratch with a fixed
seed. Every entry carries its example input shape; the batch dimension comes first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ZooEntry:
    """A built-in model: how to build it and the input it is measured with."""

    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    description: str


class MLP(nn.Module):
    """A three-layer perceptron on flattened 28x28 images."""

    def __init__(self, sizes: tuple[int, ...] = (784, 512, 256, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
            layers.append(nn.Linear(n_in, n_out))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convolutions with a residual connection."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18 (He et al., 2016) for 224x224 images, 1000 classes."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks: list[nn.Module] = []
        c_in = 64
        for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
    ]
    if act:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """MobileNet-V2 block: expand 1x1, depthwise 3x3, project 1x1."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = c_in * expand
        layers: list[nn.Module] = [] if expand == 1 else [_conv_bn(c_in, hidden, 1, 1)]
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, c_out, 1, 1, act=False)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    """MobileNet-V2 (Sandler et al., 2018), width 1.0, for 224x224 images."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2)]
        c_in = 32
        for expand, c_out, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(InvertedResidual(c_in, c_out, stride if i == 0 else 1, expand))
                c_in = c_out
        layers.append(_conv_bn(c_in, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).mean((2, 3)))


class BertFeedForward(nn.Module):
    """The feed-forward block of a BERT-base layer: two tuning tasks."""

    def __init__(self, hidden: int = 768, intermediate: int = 3072) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class BertLayer(nn.Module):
    """A BERT-base encoder layer: multi-head self-attention and feed-forward, post-norm."""

    def __init__(self, hidden: int = 768, heads: int = 12, intermediate: int = 3072) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.ffn_up = nn.Linear(hidden, intermediate)
        self.ffn_down = nn.Linear(intermediate, hidden)
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5, dim=-1)
        attn = (scores @ v).transpose(1, 2).reshape(b, s, h)
        x = self.norm1(x + self.out(attn))
        return self.norm2(x + self.ffn_down(nn.functional.gelu(self.ffn_up(x))))


ZOO: dict[str, ZooEntry] = {
    "mlp": ZooEntry(MLP, (1, 784), "3-layer perceptron 784-512-256-10"),
    "resnet18": ZooEntry(ResNet18, (1, 3, 224, 224), "ResNet-18, 224x224 RGB, 1000 classes"),
    "mobilenet_v2": ZooEntry(MobileNetV2, (1, 3, 224, 224), "MobileNet-V2 1.0, 224x224 RGB, 1000 classes"),
    "bert_layer": ZooEntry(BertLayer, (1, 128, 768), "BERT-base encoder layer, sequence 128"),
    "bert_ffn": ZooEntry(BertFeedForward, (1, 128, 768), "BERT-base feed-forward block, sequence 128"),
}

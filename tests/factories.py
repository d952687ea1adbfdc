"""User-style model factories for the loader tests (``tests.factories:NAME``)."""

import torch
from torch import nn


def tiny():
    """A valid factory: a two-layer perceptron and one example input."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), torch.randn(2, 16)


def raising():
    raise RuntimeError("weights file not found")


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace this
            return x * 2
        return x


def untraceable():
    return DataDependent(), torch.randn(2, 3)


def not_a_model():
    return 42

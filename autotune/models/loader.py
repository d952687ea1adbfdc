"""Turn a MODEL argument into a module, example inputs and exported programs.

MODEL is one of ``zoo:NAME``, ``package.module:factory`` (a callable returning an
``nn.Module`` and its example inputs) or the path of a file written by
``torch.export.save``. Every failure is a ``UsageError`` naming what was wrong.
"""

from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from autotune.errors import UsageError
from autotune.models.zoo import ZOO


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to export: the module in eval mode and one example input per argument."""

    spec: str
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    fixed_shapes: bool = False

    def with_batch(self, batch: int) -> LoadedModel:
        """The same model with every input's leading (batch) dimension set to ``batch``."""
        return self._reshaped(tuple((batch, *t.shape[1:]) for t in self.inputs))

    def with_shape(self, shape: Sequence[int]) -> LoadedModel:
        """The same model with its single input reshaped to ``shape``."""
        if len(self.inputs) != 1:
            raise UsageError(f"--input-shape needs a model with one input; {self.spec} takes {len(self.inputs)}")
        return self._reshaped((tuple(shape),))

    def _reshaped(self, shapes: tuple[tuple[int, ...], ...]) -> LoadedModel:
        if shapes == tuple(tuple(t.shape) for t in self.inputs):
            return self
        if self.fixed_shapes:
            have = [list(t.shape) for t in self.inputs]
            raise UsageError(f"saved program {self.spec} is exported for input shapes {have} only; asked for "
                             f"{[list(s) for s in shapes]} (re-export it with dynamic_shapes, or keep its shapes)")
        return LoadedModel(self.spec, self.module, tuple(_resize(t, s) for t, s in zip(self.inputs, shapes)))


def load_model(spec: str, seed: int = 0) -> LoadedModel:
    """Resolve ``spec`` to a ``LoadedModel``; raises ``UsageError`` with a one-line reason."""
    torch.manual_seed(seed)
    if spec.startswith("zoo:"):
        return _load_zoo(spec)
    if os.path.exists(spec):
        return _load_saved_program(spec)
    if ":" in spec:
        return _load_factory(spec)
    raise UsageError(
        f"MODEL {spec!r} is not a zoo name, a file or a factory; expected zoo:NAME "
        f"(one of {', '.join(sorted(ZOO))}), package.module:factory, or a torch.export file"
    )


def export(model: LoadedModel) -> torch.export.ExportedProgram:
    """Export with ``torch.export``; a failure names the operator or source line it stopped at."""
    try:
        with torch.no_grad():
            return torch.export.export(model.module, model.inputs)
    except Exception as err:  # torch.export raises many unrelated types
        raise UsageError(f"torch.export cannot export {model.spec}: {_first_line(err)}{_user_frame(err)}") from err


def _load_zoo(spec: str) -> LoadedModel:
    name = spec[len("zoo:") :]
    if name not in ZOO:
        raise UsageError(f"unknown zoo model {name!r}; expected one of: {', '.join(sorted(ZOO))}")
    entry = ZOO[name]
    return LoadedModel(spec, entry.build().eval(), (torch.randn(entry.input_shape),))


def _load_factory(spec: str) -> LoadedModel:
    module_name, _, attr = spec.rpartition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except Exception as err:
        raise UsageError(f"cannot import factory {spec!r}: {_first_line(err)}") from err
    try:
        produced = factory()
    except Exception as err:
        raise UsageError(f"factory {spec!r} raised {type(err).__name__}: {_first_line(err)}{_user_frame(err)}") from err
    if not (isinstance(produced, tuple) and len(produced) == 2 and isinstance(produced[0], nn.Module)):
        raise UsageError(f"factory {spec!r} must return (nn.Module, example inputs); got {type(produced).__name__}")
    module, inputs = produced
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise UsageError(f"factory {spec!r} must return example inputs as a tensor or a tuple of tensors")
    return LoadedModel(spec, module.eval(), inputs)


def _load_saved_program(path: str) -> LoadedModel:
    try:
        program = torch.export.load(path)
    except Exception as err:
        raise UsageError(f"cannot read saved program {path!r} (expected a torch.export.save file): {_first_line(err)}") from err
    args, kwargs = program.example_inputs or ((), {})
    if kwargs or not args:
        raise UsageError(f"saved program {path!r} carries no positional example inputs; re-save it with torch.export")
    return LoadedModel(path, program.module(), tuple(args), fixed_shapes=True)


def _resize(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if any(d <= 0 for d in shape):
        raise UsageError(f"input shape {shape} has a non-positive dimension; expected positive integers")
    if tensor.dtype.is_floating_point:
        return torch.randn(shape, dtype=tensor.dtype)
    high = int(tensor.max().item()) + 1 if tensor.numel() else 2
    return torch.randint(0, max(high, 1), shape, dtype=tensor.dtype)


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _user_frame(err: BaseException) -> str:
    """' (at file:line)' for the innermost frame outside torch and autotune, if any."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "site-packages" not in f.filename]
    frames = [f for f in frames if f"{os.sep}autotune{os.sep}" not in f.filename]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""

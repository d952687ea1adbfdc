"""The built-in zoo and the other MODEL forms load and export."""

from __future__ import annotations

import pytest
import torch

from autotune.errors import UsageError
from autotune.models.loader import export, load_model
from autotune.models.zoo import ZOO


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_exports_at_its_example_shape(name):
    model = load_model(f"zoo:{name}")
    assert tuple(model.inputs[0].shape) == ZOO[name].input_shape
    program = export(model)
    with torch.inference_mode():
        expected = model.module(*model.inputs)
        got = program.module()(*model.inputs)
    torch.testing.assert_close(got, expected)


def test_batch_and_shape_overrides():
    model = load_model("zoo:mlp").with_batch(8)
    assert tuple(model.inputs[0].shape) == (8, 784)
    assert tuple(load_model("zoo:resnet18").with_shape((2, 3, 64, 64)).inputs[0].shape) == (2, 3, 64, 64)
    with pytest.raises(UsageError, match="non-positive"):
        load_model("zoo:mlp").with_batch(0)


def test_factory_and_saved_program_round_trip(tmp_path):
    model = load_model("tests.factories:tiny")
    assert tuple(model.inputs[0].shape) == (2, 16)
    path = tmp_path / "tiny.pt2"
    torch.export.save(export(model), path)
    saved = load_model(str(path))
    torch.testing.assert_close(saved.inputs[0], model.inputs[0])
    assert saved.with_batch(2) is saved
    with pytest.raises(UsageError, match=r"exported for input shapes \[\[2, 16\]\] only"):
        saved.with_batch(5)


def test_weights_are_seeded():
    a, b = load_model("zoo:mlp"), load_model("zoo:mlp")
    torch.testing.assert_close(a.module(a.inputs[0]), b.module(b.inputs[0]))

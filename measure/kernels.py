"""Reference kernels: what calibration times and the benchmarks tune, and the quiet-machine probe.

Defined in TE so that they need no model import; sizes are those of real layers.
"""

from __future__ import annotations

from typing import Any

KERNELS = {
    "matmul512": "512x512x512 fp32 matmul",
    "conv3x3_resnet18": "ResNet-18 layer1 conv: 1x64x56x56, 64 filters 3x3, pad 1",
    "dense_bert": "BERT-base FFN dense: 128x768 by 768x3072 fp32",
}


def kernel(name: str) -> Any:
    """The kernel's PrimFunc as an IRModule."""
    import tvm
    from tvm import te, topi

    if name == "matmul512":
        a = te.placeholder((512, 512), name="A")
        b = te.placeholder((512, 512), name="B")
        k = te.reduce_axis((0, 512), name="k")
        args = [a, b, te.compute((512, 512), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")]
    elif name == "conv3x3_resnet18":
        data = te.placeholder((1, 64, 56, 56), name="data")
        weight = te.placeholder((64, 64, 3, 3), name="weight")
        args = [data, weight, topi.nn.conv2d_nchw(data, weight, 1, 1, 1)]
    elif name == "dense_bert":
        x = te.placeholder((128, 768), name="X")
        w = te.placeholder((3072, 768), name="W")
        args = [x, w, topi.nn.dense(x, w)]
    else:
        raise KeyError(f"unknown kernel {name!r}; expected one of: {', '.join(KERNELS)}")
    return tvm.IRModule({"main": te.create_prim_func(args)})


PROBE_SIZE = 192  # about 1.5 ms on two of this host's cores, 3 ms on one


def probe() -> tuple[Any, tuple[tuple[str, tuple[int, ...]], ...]]:
    """A fixed, parallel, vectorized matmul and its argument shapes: its time moves only when the machine's does.

    A measurement worker times it before and after each candidate (``measure.timing``): on a shared
    host, a neighbour can slow a core by 20-100% for seconds at a time, and a candidate timed in such
    a spell is off by as much, however many times it is repeated.
    """
    import tvm
    from tvm import te

    n = PROBE_SIZE
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    i, j, kk = sch.get_loops(sch.get_sblock("C"))
    sch.reorder(i, kk, j)
    sch.parallel(i)
    sch.vectorize(j)
    return sch.mod, (("float32", (n, n)),) * 3

"""A batched product whose one reader is a transpose writes its result in
that transpose's layout (compiler/dot_lowering.py, the Executable's
output_order): the same bits, and the transpose's result is C-contiguous
(attention's outputs transposed back to (B, S, H, D) and read by the next
projection without a copy)."""

import keras
import numpy as np
import pytest

from keras_ipu.device.compiler import executable
from keras_ipu.device.compiler.cache import ExecutableCache
from keras_ipu.device.jit import jit
from keras_ipu.device.native import threads

B, S, H, D = 8, 16, 4, 8


def _attention_output(probs, v, w):
    # (B, H, S, S) @ (B, S, H, D) -> (B, S, H, D), then the projection.
    out = keras.ops.einsum("bhqk,bkhd->bqhd", probs, v)
    return keras.ops.matmul(keras.ops.reshape(out, (B * S, H * D)), w), out


def _args():
    rng = np.random.default_rng(5)
    shapes = [(B, H, S, S), (B, S, H, D), (H * D, 16)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _steps(exe, args):
    """Every value the program's steps make, in program order."""
    env = exe._template[:]
    env[: exe._n_inputs] = list(args)
    values = []
    for kernel, ins, out, multi, _ in exe._program:
        result = kernel(*[env[i] for i in ins])
        if multi:
            for s, v in zip(out, result):
                env[s] = v
        else:
            env[out] = result
        values.append(result)
    return values


def _compiled(args):
    fast = jit(_attention_output, cache=ExecutableCache(disk=False))
    return fast.executable(*args), [np.asarray(v) for v in fast(*args)]


@pytest.mark.parametrize("cap", [1, 2])
def test_the_transpose_of_an_ordered_product_is_contiguous_with_the_same_bits(
        monkeypatch, cap):
    monkeypatch.setattr(threads, "_cap", cap)
    monkeypatch.setattr(threads, "_plans", {})
    args = _args()
    exe, got = _compiled(args)
    names = [node.primitive.name for node in exe.graph.nodes]
    at = [i for i, name in enumerate(names) if name == "transpose"
          and names[i - 1] == "dot_general"]
    assert at, names  # the einsum's product, then its transpose
    values = _steps(exe, args)
    for i in at:
        assert values[i].flags.c_contiguous
        assert not values[i - 1].flags.c_contiguous  # the product's result: a view

    monkeypatch.setattr(executable, "ORDERED_OUTPUT_LOWERINGS", set())
    plain, want = _compiled(args)
    plain_values = _steps(plain, args)
    assert not any(plain_values[i].flags.c_contiguous for i in at)
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()
    for i in at:
        assert values[i].tobytes() == np.ascontiguousarray(plain_values[i]).tobytes()


def test_a_layout_gemm_cannot_write_keeps_the_products_own(monkeypatch):
    # dK-like: the transpose puts the result's columns a row apart, where
    # np.matmul would leave gemm for its own loop (other bits).
    from keras_ipu.device.compiler import dot_lowering

    assert dot_lowering._ordered_result((0, 3, 1, 2), (B, H, D, S), (B, H, D, S),
                                        np.dtype(np.float32)) is None
    assert dot_lowering._ordered_result((0, 1, 2, 3), (B, H, S, D), (B, H, S, D),
                                        np.dtype(np.float32)) is None
    assert dot_lowering._ordered_result((0, 2, 1, 3), (B, H, S, D), (B, H, S, D),
                                        np.dtype(np.float32)) is not None

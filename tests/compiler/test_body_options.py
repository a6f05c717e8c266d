"""Compile options reach cond branches and loop bodies: each pass a
CompileOptions turns off stays off inside them (the bodies are compiled
with the outer program's options, pipeline.body_options)."""

import numpy as np
import pytest
from compiler_graphs import aval
from compiler_graphs import build
from compiler_graphs import lit

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler import compile_graph


def _body():
    # x -> (x * 2 + 1) * (x * 2 + 1); (2 + 3) folds; exp(x) is dead; x * 2
    # is computed twice (CSE); the chain of elementwise ops fuses.
    def body(b, x):
        five = b.op("add", lit(2.0, "float32"), lit(3.0, "float32"))
        b.op("exp", x)
        a = b.op("add", b.op("mul", x, lit(2.0, "float32")), lit(1.0, "float32"))
        c = b.op("add", b.op("mul", x, lit(2.0, "float32")), lit(1.0, "float32"))
        return b.op("mul", b.op("mul", a, c), five)

    return build([aval((8,))], body)


def _loop_program():
    body = _body()

    def outer(b, x):
        (y,) = b.op("scan", x, body=body, length=3, reverse=False, n_carry=1, n_xs=0,
                    unroll=1)
        return y

    return build([aval((8,))], outer)


def _cond_program():
    branch = _body()

    def outer(b, i, x):
        (y,) = b.op("cond", i, x, branches=(branch, branch))
        return y

    return build([aval((), "int32"), aval((8,))], outer)


def _body_names(exe):
    (inner,) = exe.subprograms.values()
    inner = inner if not isinstance(inner, tuple) else inner[0]
    return [node.primitive.name for node in inner.steps]


@pytest.mark.parametrize("program", [_loop_program, _cond_program])
def test_each_option_applies_inside_bodies(program):
    names = _body_names(compile_graph(program()))
    assert names == ["fused_elementwise"]  # folded, deduplicated, dead code gone, fused
    names = _body_names(compile_graph(program(), CompileOptions(fuse_elementwise=False)))
    assert "fused_elementwise" not in names
    assert names.count("mul") == 3 and names.count("add") == 1
    names = _body_names(compile_graph(
        program(), CompileOptions(fuse_elementwise=False,
                                  eliminate_common_subexpressions=False)))
    assert names.count("mul") == 4
    names = _body_names(compile_graph(
        program(), CompileOptions(fuse_elementwise=False, eliminate_dead_code=False)))
    assert "exp" in names
    names = _body_names(compile_graph(
        program(), CompileOptions(fuse_elementwise=False, fold_constants=False)))
    assert names.count("add") == 2  # 2 + 3 is computed in the body


def test_bodies_compiled_without_fusion_compute_the_same():
    x = np.linspace(-1, 1, 8).astype(np.float32)
    want = compile_graph(_loop_program()).run(x)[0]
    got = compile_graph(_loop_program(), CompileOptions(fuse_elementwise=False)).run(x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)

"""HLO collectives across replicas through the TensorFlow front end
(opcodes/collectives.py): reduce-scatter from TensorFlow's XlaReduceScatter,
all-gather, all-to-all and collective-permute from StableHLO in an
XlaCallModule (TensorFlow has no CPU kernels of its own for them), run on
2 and 4 simulated replicas and compared with NumPy."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.compiler.tf2xla.ops import gen_xla_ops  # noqa: E402

from keras_ipu.device.simulator.replicas import run_replicated  # noqa: E402
from keras_ipu.frontends.tensorflow.function import BridgedFunction  # noqa: E402


def _stablehlo(op, attrs, n, in_shape, out_shape):
    def t(shape):
        return "tensor<" + "x".join(map(str, shape)) + "xf32>"

    return f"""
module @m attributes {{mhlo.num_replicas = {n} : i32, mhlo.num_partitions = 1 : i32}} {{
  func.func public @main(%arg0: {t(in_shape)}) -> {t(out_shape)} {{
    %0 = "stablehlo.{op}"(%arg0) {{{attrs}}} : ({t(in_shape)}) -> {t(out_shape)}
    return %0 : {t(out_shape)}
  }}
}}
"""


def _call_module(module, x, out_shape):
    return gen_xla_ops.xla_call_module(
        [x], version=9, module=module.encode(), Sout=[tf.TensorShape(out_shape)],
        Tout=[tf.float32], dim_args_spec=[], platforms=["CPU"], function_list=[],
        has_token_input_output=False, disabled_checks=[])[0]


def _groups_attr(groups):
    rows = ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups)
    return f"dense<[{rows}]> : tensor<{len(groups)}x{len(groups[0])}xi64>"


def _run(fn, base, n):
    """Each replica's output of `fn(x)`, x = base + 10 * replica id."""

    def program(t):
        replica = tf.cast(gen_xla_ops.xla_replica_id(), tf.float32)
        return fn(t + 10.0 * replica)

    bridged = BridgedFunction(program)
    _, _, arrays, prog = bridged.program((tf.constant(base),), replicas=n)
    exe = bridged.executable(prog)
    feed = [arrays[i] for i in prog.param_inputs]
    if prog.uses_token:
        feed.append(np.zeros((), np.uint32))
    outs = run_replicated(lambda *xs: exe.run(*xs), [feed] * n)
    return [np.asarray(o[0]) for o in outs], [base + 10.0 * r for r in range(n)]


BASE = np.arange(32, dtype=np.float32).reshape(8, 4) / 7.0


@pytest.mark.parametrize("n", [2, 4])
def test_reduce_scatter_from_tensorflow(n):
    got, xs = _run(lambda x: gen_xla_ops.xla_reduce_scatter(x, [list(range(n))], 0, "Add"),
                   BASE, n)
    total = sum(xs)
    for r in range(n):
        np.testing.assert_allclose(got[r], np.split(total, n)[r], rtol=1e-6)


@pytest.mark.parametrize("n", [2, 4])
def test_all_gather(n):
    groups = [list(range(n))]
    module = _stablehlo("all_gather", f"all_gather_dim = 1 : i64, replica_groups = "
                        f"{_groups_attr(groups)}", n, (8, 4), (8, 4 * n))
    got, xs = _run(lambda x: _call_module(module, x, (8, 4 * n)), BASE, n)
    for r in range(n):
        np.testing.assert_array_equal(got[r], np.concatenate(xs, axis=1))


@pytest.mark.parametrize("n, groups", [(2, [[0, 1]]), (4, [[0, 1, 2, 3]]),
                                       (4, [[0, 2], [1, 3]])])
def test_all_to_all(n, groups):
    k = len(groups[0])
    attrs = (f"split_dimension = 0 : i64, concat_dimension = 0 : i64, split_count = {k} : i64, "
             f"replica_groups = {_groups_attr(groups)}")
    module = _stablehlo("all_to_all", attrs, n, (8, 4), (8, 4))
    got, xs = _run(lambda x: _call_module(module, x, (8, 4)), BASE, n)
    for group in groups:
        for position, r in enumerate(group):
            want = np.concatenate([np.split(xs[m], k)[position] for m in group])
            np.testing.assert_array_equal(got[r], want)


@pytest.mark.parametrize("n", [2, 4])
def test_collective_permute(n):
    pairs = [[r, (r + 1) % n] for r in range(n - 1)]
    rows = ", ".join(f"[{s}, {t}]" for s, t in pairs)
    attrs = (f"source_target_pairs = dense<[{rows}]> : tensor<{len(pairs)}x2xi64>, "
             "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>")
    module = _stablehlo("collective_permute", attrs, n, (8, 4), (8, 4))
    got, xs = _run(lambda x: _call_module(module, x, (8, 4)), BASE, n)
    np.testing.assert_array_equal(got[0], np.zeros((8, 4), np.float32))
    for s, t in pairs:
        np.testing.assert_array_equal(got[t], xs[s])


def test_the_imported_collective_is_costed_on_the_links():
    n = 4
    module = _stablehlo("all_gather", f"all_gather_dim = 0 : i64, replica_groups = "
                        f"{_groups_attr([list(range(n))])}", n, (8, 4), (32, 4))
    bridged = BridgedFunction(lambda t: _call_module(module, t, (32, 4)))
    _, _, _, prog = bridged.program((tf.constant(BASE),), replicas=n)
    exe = bridged.executable(prog)
    (node,) = [s for s in exe.graph.nodes if s.primitive.name == "cross_replica_all_gather"]
    cost = node.primitive.cost([v.aval for v in node.inputs], [v.aval for v in node.outputs],
                               **node.params)
    # [RING]: 3/4 of the gathered 32x4 float32 (512 bytes) in 3 steps.
    assert (cost.link_bytes, cost.link_steps) == (384, 3)

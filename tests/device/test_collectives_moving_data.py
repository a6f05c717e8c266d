"""The collectives that move data between replicas (primitives/collective.py:
reduce-scatter, all-gather, all-to-all, collective-permute) on 2 and 4
simulated replicas against NumPy, traced and compiled as well as eager,
their shape checks and their link costs against hand computations."""

import numpy as np
import pytest

from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.jit import jit
from keras_ipu.device.primitives import collective as c
from keras_ipu.device.primitives import cost_util
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator.replicas import run_replicated


def _operands(n, shape=(4, 6)):
    rng = np.random.default_rng(n)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _on_replicas(fn, xs, compiled):
    if compiled:
        f = jit(fn, options=CompileOptions())
        return [np.asarray(y) for y in run_replicated(f, [[x] for x in xs])]
    return [np.asarray(y) for y in run_replicated(fn, [[x] for x in xs])]


def _groups(n, strided):
    if not strided:
        return None, [list(range(n))]
    return tuple(tuple(range(s, n, 2)) for s in range(2)), [list(range(s, n, 2)) for s in range(2)]


CASES = [(n, strided, compiled) for n in (2, 4) for strided in (False, True)
         for compiled in (False, True) if not (strided and n == 2)]


@pytest.mark.parametrize("n, strided, compiled", CASES)
def test_reduce_scatter(n, strided, compiled):
    xs = _operands(n, (8, 3))
    groups, members = _groups(n, strided)
    got = _on_replicas(lambda x: c.cross_replica_reduce_scatter(x, n, groups, "sum", 0), xs,
                       compiled)
    for group in members:
        total = sum(xs[m] for m in group)
        for position, r in enumerate(group):
            np.testing.assert_allclose(got[r], np.split(total, len(group))[position],
                                       rtol=1e-6)
        assert all(got[r].dtype == np.float32 for r in group)


@pytest.mark.parametrize("op, reduce", [("max", np.maximum), ("min", np.minimum),
                                        ("prod", np.multiply)])
def test_reduce_scatter_by_other_reducers(op, reduce):
    for n in (2, 4):
        xs = _operands(n, (2, 8))
        got = _on_replicas(lambda x: c.cross_replica_reduce_scatter(x, n, None, op, 1), xs,
                           False)
        total = reduce.reduce(np.stack(xs))
        for r in range(n):
            np.testing.assert_allclose(got[r], np.split(total, n, axis=1)[r], rtol=1e-6)


@pytest.mark.parametrize("n, strided, compiled", CASES)
def test_all_gather(n, strided, compiled):
    xs = _operands(n, (2, 3))
    groups, members = _groups(n, strided)
    got = _on_replicas(lambda x: c.cross_replica_all_gather(x, n, groups, 1), xs, compiled)
    for group in members:
        want = np.concatenate([xs[m] for m in group], axis=1)
        for r in group:
            np.testing.assert_array_equal(got[r], want)


@pytest.mark.parametrize("n, strided, compiled", CASES)
@pytest.mark.parametrize("split, concat", [(0, 0), (0, 1), (1, 0)])
def test_all_to_all(n, strided, compiled, split, concat):
    xs = _operands(n, (4, 8))
    groups, members = _groups(n, strided)
    got = _on_replicas(lambda x: c.cross_replica_all_to_all(x, n, groups, split, concat), xs,
                       compiled)
    for group in members:
        k = len(group)
        for position, r in enumerate(group):
            want = np.concatenate([np.split(xs[m], k, axis=split)[position] for m in group],
                                  axis=concat)
            np.testing.assert_array_equal(got[r], want)


@pytest.mark.parametrize("n, compiled", [(2, False), (2, True), (4, False), (4, True)])
def test_collective_permute(n, compiled):
    xs = _operands(n, (3,))
    pairs = [(r, (r + 1) % n) for r in range(n - 1)]  # a chain: replica 0 receives nothing
    got = _on_replicas(lambda x: c.collective_permute(x, n, pairs), xs, compiled)
    np.testing.assert_array_equal(got[0], np.zeros(3, np.float32))
    for s, t in pairs:
        np.testing.assert_array_equal(got[t], xs[s])


def test_one_replica_outside_a_replicated_run():
    x = _operands(1, (4, 2))[0]
    np.testing.assert_array_equal(np.asarray(c.cross_replica_reduce_scatter(x, 1)), x)
    np.testing.assert_array_equal(np.asarray(c.cross_replica_all_gather(x, 1)), x)
    np.testing.assert_array_equal(np.asarray(c.cross_replica_all_to_all(x, 1, None, 0, 1)), x)
    np.testing.assert_array_equal(np.asarray(c.collective_permute(x, 1, [(0, 0)])), x)
    np.testing.assert_array_equal(np.asarray(c.collective_permute(x, 1, [])), 0 * x)
    with pytest.raises(RuntimeError, match="compiled for 2 replicas but runs outside"):
        c.cross_replica_all_gather(x, 2)


def test_bad_arguments_are_named():
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="dimension 0 of size 3 does not split into 2"):
        run_replicated(lambda y: c.cross_replica_reduce_scatter(y, 2), [[x], [x]])
    with pytest.raises(ValueError, match=r"must split the 4 replicas"):
        c.cross_replica_all_gather(x, 4, ((0, 1), (2,)))
    with pytest.raises(ValueError, match="names a replica outside 0..1"):
        c.collective_permute(x, 2, [(0, 2)])
    with pytest.raises(ValueError, match="a replica receives twice"):
        c.collective_permute(x, 4, [(0, 1), (2, 1)])
    with pytest.raises(ValueError, match="reduces by one of"):
        c.cross_replica_reduce_scatter(x, 1, op="mean")


def _cost(primitive, x, out, **params):
    return primitive.cost([x], [out], **params)


def test_link_costs_are_the_cost_models():
    from keras_ipu.device.ir import ShapedArray

    x = ShapedArray((8, 4), np.float32)  # 128 bytes
    groups4 = (tuple(range(4)),)
    # Reduce-scatter over 4: 3/4 of 128 bytes in 3 ring steps; 3/4 of the
    # 32 elements added.
    cost = _cost(c.cross_replica_reduce_scatter_p, x, ShapedArray((2, 4), np.float32),
                 replicas=4, groups=groups4, op="sum", dimension=0)
    assert (cost.link_bytes, cost.link_steps, cost.kind) == (96, 3, "collective")
    assert cost.flops == 24
    # All-gather: the gathered result's 3/4 (of 512 bytes) in 3 steps.
    cost = _cost(c.cross_replica_all_gather_p, x, ShapedArray((32, 4), np.float32),
                 replicas=4, groups=groups4, dimension=0)
    assert (cost.link_bytes, cost.link_steps) == (384, 3)
    # All-to-all in groups of 2: half the operand in one step.
    cost = _cost(c.cross_replica_all_to_all_p, x, x, replicas=4, groups=((0, 2), (1, 3)),
                 split_dimension=0, concat_dimension=0)
    assert (cost.link_bytes, cost.link_steps) == (64, 1)
    # Permute: the whole operand once; nothing when no pair sends.
    cost = _cost(c.collective_permute_p, x, x, replicas=2, pairs=((0, 1),))
    assert (cost.link_bytes, cost.link_steps) == (128, 1)
    cost = _cost(c.collective_permute_p, x, x, replicas=2, pairs=())
    assert (cost.link_bytes, cost.link_steps) == (0, 0)
    assert cost_util.nbytes(x) == 128
    # The formulas beside the all-reduce's: half of its ring.
    assert cost_model.reduce_scatter_link_traffic(1000, 4)[0] * 2 == \
        cost_model.all_reduce_link_traffic(1000, 4)[0]


def _vjp_on_replicas(fn, xs, cts):
    from keras_ipu.device import autodiff

    def one(x, ct):
        _, back = autodiff.vjp(fn, x)
        (g,) = back(ct)
        return np.asarray(g)

    return run_replicated(one, list(zip(xs, cts)))


def test_gradients_on_four_replicas_are_the_transposes():
    n = 4
    xs, cts = _operands(n, (2, 4)), _operands(n + 10, (8, 4))[:n]
    # all-gather along 0: d/dx_r = sum over replicas q of block r of ct_q.
    got = _vjp_on_replicas(lambda x: c.cross_replica_all_gather(x, n, None, 0), xs, cts)
    total = sum(cts)
    for r in range(n):
        np.testing.assert_allclose(got[r], np.split(total, n)[r], rtol=1e-6)
    # reduce-scatter (sum) along 0: every replica's operand gets all the
    # members' cotangents, gathered.
    xs8 = _operands(n, (8, 4))
    cts2 = [ct[:2] for ct in cts]
    got = _vjp_on_replicas(lambda x: c.cross_replica_reduce_scatter(x, n, None, "sum", 0), xs8,
                           cts2)
    for r in range(n):
        np.testing.assert_allclose(got[r], np.concatenate(cts2), rtol=1e-6)
    # all-to-all (split 1, concat 0) back by all-to-all (split 0, concat 1).
    x24 = _operands(n, (2, 8))
    ct = [np.ascontiguousarray(v.reshape(8, 2)) for v in _operands(n + 20, (2, 8))]
    got = _vjp_on_replicas(lambda x: c.cross_replica_all_to_all(x, n, None, 1, 0), x24, ct)
    for r in range(n):
        want = np.concatenate([np.split(ct[q], n, axis=0)[r] for q in range(n)], axis=1)
        np.testing.assert_allclose(got[r], want, rtol=1e-6)
    # permute r -> r+1 (a ring): the cotangent comes back from r+1.
    ring = [(q, (q + 1) % n) for q in range(n)]
    got = _vjp_on_replicas(lambda x: c.collective_permute(x, n, ring), xs, cts2)
    for r in range(n):
        np.testing.assert_allclose(got[r], cts2[(r + 1) % n], rtol=1e-6)

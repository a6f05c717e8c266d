"""Every HLO opcode the TensorFlow front end imports gives TensorFlow's
numbers.

Each case is a TensorFlow function compiled twice: by TensorFlow itself
(XLA on the CPU, `jit_compile=True`) and through the front end (HLO ->
keras_ipu IR -> compiler -> simulator). float32 results agree within 1e-5
relative; integer and boolean results exactly. The last test checks that
these cases exercise every opcode with an import rule.
"""

import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.compiler.tf2xla.ops import gen_xla_ops  # noqa: E402
from tensorflow.compiler.tf2xla.python import xla  # noqa: E402

from keras_ipu.frontends.tensorflow import hlo_proto  # noqa: E402
from keras_ipu.frontends.tensorflow import importer  # noqa: E402
from keras_ipu.frontends.tensorflow.feeds import Infeed  # noqa: E402
from keras_ipu.frontends.tensorflow.feeds import Outfeed  # noqa: E402
from keras_ipu.frontends.tensorflow.function import BridgedFunction  # noqa: E402

RTOL = 1e-5

rng = np.random.default_rng(0)
X = rng.normal(size=(4, 8)).astype(np.float32)
M = rng.normal(size=(8, 8)).astype(np.float32)
IMG = rng.normal(size=(2, 6, 6, 3)).astype(np.float32)
IDX = np.array([0, 2, 1], np.int32)
INTS = np.array([7, -7, 5, -3, 0, 12], np.int32)
POS = (np.abs(X) + 0.5).astype(np.float32)


def _bn_grad(x):
    return tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=x * 0.5, x=x, scale=tf.constant([1.0, 2.0, 0.5]),
        reserve_space_1=tf.reduce_mean(x, [0, 1, 2]),
        reserve_space_2=tf.math.reduce_variance(x, [0, 1, 2]),
        reserve_space_3=tf.zeros(3))[:3]


def _max_pool_grad(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.nn.max_pool2d(x, 3, 2, "SAME")
    return tape.gradient(y, x, output_gradients=y * 2.0)


def _while_with_cond(x):
    def body(i, acc):
        acc = tf.cond(i % 2 == 0, lambda: acc * 1.5, lambda: acc - 1.0)
        return i + 1, acc
    return tf.while_loop(lambda i, a: i < 5, body, (tf.constant(0), x))[1]


def _switch(x):
    k = tf.cast(tf.reduce_sum(x) > 0, tf.int32) + 1
    return tf.switch_case(k, [lambda: x * 2, lambda: x - 1, lambda: tf.sin(x)])


# name -> (function, arguments). Functions see tensors of the arguments.
CASES = {
    "dense_relu": (lambda x, m: tf.nn.relu(x @ m + 1.0), (X, M)),
    "einsum_batch_dot": (lambda x: tf.einsum("bij,bjk->bik", tf.reshape(x, (2, 2, 8)),
                                               tf.reshape(x, (2, 8, 2))), (X,)),
    "unary_math": (lambda x: tf.exp(x) + tf.math.log1p(tf.abs(x)) + tf.math.expm1(x / 4)
                   + tf.sin(x) * tf.cos(x) + tf.tan(x / 4) + tf.tanh(x) + tf.sigmoid(x)
                   + tf.sqrt(tf.abs(x)) + tf.math.rsqrt(tf.abs(x) + 1) + tf.math.erf(x)
                   + tf.sign(x) + tf.floor(x) + tf.math.ceil(x) + tf.round(x * 3)
                   + tf.math.log(tf.abs(x) + 1), (X,)),
    "binary_math": (lambda x, y: tf.pow(tf.abs(x) + 0.5, y) + tf.math.atan2(x, y)
                    + tf.maximum(x, y) - tf.minimum(x, y) + x / (tf.abs(y) + 1)
                    + tf.math.floormod(x, 0.7) + tf.truncatemod(x, 0.7), (X, X[::-1].copy())),
    "integer_math": (lambda i: tf.stack([i // 3, tf.math.floormod(i, 3), tf.truncatediv(i, 3),
                                         tf.truncatemod(i, 3), i * i - i, tf.abs(i), -i]), (INTS,)),
    "bitwise": (lambda i: tf.stack([
        tf.bitwise.left_shift(i, 2), tf.bitwise.right_shift(i, 1),
        tf.bitwise.bitwise_and(i, 6) | tf.bitwise.bitwise_xor(i, 5),
        tf.bitwise.invert(i), tf.cast(tf.raw_ops.PopulationCount(x=i), tf.int32),
        xla.shift_right_logical(i, tf.constant(1)),
    ]), (INTS,)),
    "logic_compare_select": (lambda x: tf.where(tf.logical_and(x > 0, tf.logical_not(x > 1)),
                                                x, tf.cast(tf.math.is_finite(x), tf.float32)), (X,)),
    "clamp": (lambda x: tf.clip_by_value(x, -0.5, 0.5) + xla.clamp(-0.1, x, 0.1), (X,)),
    "convert_bitcast": (lambda x: tf.cast(tf.bitcast(x, tf.int32) % 1000, tf.float32)
                        + tf.cast(tf.cast(x * 100, tf.int64), tf.float32)
                        + tf.cast(tf.cast(x, tf.float16), tf.float32)
                        + tf.cast(tf.bitcast(tf.cast(x, tf.float64), tf.int32)[..., 0] % 7, tf.float32), (X,)),
    "complex": (lambda x: tf.abs(tf.complex(x, x * 2)) + tf.math.real(tf.complex(x, x))
                + tf.math.imag(tf.complex(x, -x)), (X,)),
    "reduce_precision": (lambda x: xla.reduce_precision(x * 1000, exponent_bits=5, mantissa_bits=10), (X,)),
    "reductions": (lambda x: tf.stack([tf.reduce_sum(x, 0), tf.reduce_prod(x, 0), tf.reduce_max(x, 0),
                                       tf.reduce_min(x, 0), tf.reduce_logsumexp(x, 0)]), (X,)),
    "reduce_bool": (lambda x: tf.stack([tf.reduce_any(x > 1, 0), tf.reduce_all(x > -1, 0)]), (X,)),
    "argmax_argmin": (lambda x: tf.stack([tf.argmax(x, 1), tf.argmin(x, 0)[:4]]), (X,)),
    "softmax_xent": (lambda x: tf.nn.sparse_softmax_cross_entropy_with_logits(IDX[:3], x[:3, :5]), (X,)),
    "shapes": (lambda x: tf.concat([tf.transpose(tf.reshape(x, (8, 4)))[:, ::2], tf.reverse(x, [1])[:, 1::2],
                                    tf.tile(x[:, :1], (1, 4))], 1), (X,)),
    "pad_and_iota": (lambda x: tf.pad(x, [[1, 2], [0, 1]], mode="REFLECT")
                     + tf.cast(tf.range(9)[None, :], tf.float32)
                     + tf.pad(x, [[1, 2], [1, 0]], constant_values=3.0), (X,)),
    "one_hot": (lambda i: tf.one_hot(i, 5) + tf.transpose(tf.one_hot(i, 5, axis=0)), (IDX,)),
    "gather": (lambda x, i: tf.concat([tf.gather(x, i, axis=1), tf.gather(x, [3, 0, 1], axis=0)[:, :3]], 0), (X, IDX)),
    "gather_nd": (lambda x: tf.gather_nd(x, [[0, 1], [2, 3], [3, 7]]), (X,)),
    "gather_windows": (lambda x: xla.gather(
        x, tf.constant([[1, 2], [3, 7]]),
        dimension_numbers=_gather_dims(offset_dims=[1, 2], collapsed=[], start_index_map=[0, 1],
                                       index_vector_dim=1),
        slice_sizes=[2, 3], indices_are_sorted=False), (X,)),
    "scatter": (lambda x: tf.tensor_scatter_nd_update(x, [[0, 1], [2, 3]], [1.0, 2.0])
                + tf.tensor_scatter_nd_add(x, [[1], [1], [9]], tf.ones((3, 8)))
                + tf.tensor_scatter_nd_max(x, [[0, 0]], [5.0]), (X,)),
    "segment_sum": (lambda x: tf.math.unsorted_segment_sum(x, [0, 1, 0, 1], 2)
                    + tf.math.unsorted_segment_max(x, [1, 1, 0, 0], 2), (X,)),
    "dynamic_slices": (lambda x, i: xla.dynamic_slice(x, [i[1], i[2]], [2, 3])
                       + xla.dynamic_update_slice(x, tf.ones((2, 2)), [i[0], 6])[:2, :3], (X, IDX)),
    "cumulative": (lambda x: tf.cumsum(x, 1) + tf.math.cumprod(x, 1, exclusive=True)
                   + tf.math.cumulative_logsumexp(x, 1), (X,)),
    "pooling": (lambda x: tf.concat([tf.nn.avg_pool2d(x, 2, 2, "SAME"), tf.nn.max_pool2d(x, 3, 2, "SAME")], 3), (IMG,)),
    "max_pool_grad": (_max_pool_grad, (IMG,)),
    "conv2d_and_grads": (lambda x: tf.concat([tf.reshape(t, (2, -1)) for t in tf.gradients(
        tf.reduce_sum(tf.nn.conv2d(x, tf.reshape(tf.range(54, dtype=tf.float32), (3, 3, 3, 2)) / 50,
                                   2, "SAME") ** 2), [x])], 1), (IMG,)),
    "depthwise_and_grads": (lambda x: _depthwise_grads(x), (IMG,)),
    "conv_transpose_dilated": (lambda x: tf.nn.conv2d_transpose(x, tf.ones((3, 3, 2, 3)) / 9, (2, 12, 12, 2), 2)
                               [:, ::3, ::3] + tf.nn.conv2d(x, tf.ones((2, 2, 3, 2)) / 4, 1, "SAME",
                                                            dilations=2)[:, :4, :4], (IMG,)),
    "conv3d": (lambda x: tf.nn.conv3d(tf.reshape(x, (1, 4, 6, 9, 1)), tf.ones((2, 2, 2, 1, 2)) / 8,
                                      [1, 1, 1, 1, 1], "VALID"), (IMG,)),
    "batch_norm_opcodes": (lambda x: tf.concat([
        tf.reshape(tf.compat.v1.nn.fused_batch_norm(x, tf.ones(3), tf.zeros(3), is_training=True)[0], (-1,)),
        tf.reshape(tf.compat.v1.nn.fused_batch_norm(x, tf.ones(3), tf.zeros(3), tf.zeros(3) + 0.1,
                                                    tf.ones(3), is_training=False)[0], (-1,)),
        tf.concat([tf.reshape(t, (-1,)) for t in _bn_grad(x)], 0)], 0), (IMG,)),
    "resize": (lambda x: tf.concat([tf.image.resize(x, (9, 9)), tf.image.resize(x, (9, 9), method="nearest")], 3), (IMG,)),
    "sort_topk": (lambda x: tf.concat([tf.sort(x), tf.sort(x, direction="DESCENDING"),
                                       tf.cast(tf.argsort(x), tf.float32), tf.math.top_k(x, 3).values], 1), (X,)),
    "sort_keys": (lambda x: xla.key_value_sort(tf.reshape(x, [-1]), tf.reshape(x * x, [-1]))[1], (X,)),
    "while_cond_call": (_while_with_cond, (X,)),
    "switch_case": (_switch, (X,)),
    "linalg": (lambda m: tf.concat([tf.linalg.cholesky(m @ tf.transpose(m) + 8 * tf.eye(8)),
                                    tf.linalg.triangular_solve(tf.linalg.band_part(m, -1, 0) + 8 * tf.eye(8), m),
                                    tf.linalg.triangular_solve(tf.linalg.band_part(m, 0, -1) + 8 * tf.eye(8), m,
                                                               lower=False, adjoint=True)], 1), (M,)),
    "eigh": (lambda m: tf.abs(tf.linalg.eigh(m + tf.transpose(m))[0]), (M,)),
    "qr_inv_solve": (lambda m: tf.concat([tf.abs(tf.linalg.qr(m)[1]), tf.abs(tf.linalg.qr(m)[0]),
                                          tf.linalg.inv(m + 8 * tf.eye(8)),
                                          tf.linalg.solve(m + 8 * tf.eye(8), m)], 1), (M,)),
    "qr_batched_rect": (lambda x: [tf.abs(t) for t in tf.linalg.qr(tf.reshape(x, (2, 4, 4))[:, :, :3])], (X,)),
    "fft": (lambda x: tf.concat([tf.abs(tf.signal.fft(tf.cast(x, tf.complex64))), tf.abs(tf.signal.rfft(x)),
                                 tf.signal.irfft(tf.signal.rfft(x))], 1), (X,)),
    "stateless_random": (lambda x: tf.concat([
        tf.random.stateless_normal((4, 5), seed=[1, 2]), tf.random.stateless_uniform((4, 3), seed=[3, 4]),
        tf.random.stateless_uniform((4, 7), seed=[1, 2], alg="threefry"),
        tf.cast(tf.random.stateless_uniform((4, 2), seed=[5, 6], minval=0, maxval=100, dtype=tf.int64), tf.float32),
        tf.cast(tf.random.stateless_uniform((4, 3), seed=[5, 6], minval=0, maxval=9, dtype=tf.int32,
                                            alg="threefry"), tf.float32),
    ], 1), (X,)),
    "rng_bit_generator": (lambda x: tf.concat([
        tf.cast(xla.rng_bit_generator(xla_data_alg("RNG_PHILOX"), tf.constant([1, 2], tf.uint64),
                                      (3, 5), dtype=tf.uint32)[1] % 1000, tf.float32),
        tf.cast(xla.rng_bit_generator(xla_data_alg("RNG_PHILOX"), tf.constant([4, 5], tf.uint64),
                                      (3, 2), dtype=tf.uint64)[1] % 1000, tf.float32),
        tf.cast(xla.rng_bit_generator(xla_data_alg("RNG_THREE_FRY"), tf.constant([7, 8], tf.uint64),
                                      (3, 3), dtype=tf.uint32)[1] % 1000, tf.float32),
        tf.cast(xla.rng_bit_generator(xla_data_alg("RNG_PHILOX"), tf.constant([7, 8], tf.uint64),
                                      (3, 1), dtype=tf.uint8)[1], tf.float32),
    ], 1), (X,)),
    # TensorFlow's own CPU run of these crashes (XLA:CPU has no collectives
    # runtime outside a multi-device client): compared with their meaning in
    # a group of one replica instead.
    "collectives_one_replica": (lambda x: gen_xla_ops.xla_all_reduce(x, [[0]], "Add", "CrossReplica")
                                + gen_xla_ops.xla_reduce_scatter(x, [[0]], 0, "Add")
                                + tf.cast(gen_xla_ops.xla_replica_id(), tf.float32), (X,),
                                lambda x: x + x),
    "optimization_barrier": (lambda x: xla.optimization_barrier(x * 2)[0] + 1, (X,)),
}


def xla_data_alg(name):
    _, xla_data_pb2 = hlo_proto.protos()
    return xla_data_pb2.RandomAlgorithm.Value(name)


def _gather_dims(offset_dims, collapsed, start_index_map, index_vector_dim):
    _, xla_data_pb2 = hlo_proto.protos()
    dims = xla_data_pb2.GatherDimensionNumbers()
    dims.offset_dims.extend(offset_dims)
    dims.collapsed_slice_dims.extend(collapsed)
    dims.start_index_map.extend(start_index_map)
    dims.index_vector_dim = index_vector_dim
    return dims


def _depthwise_grads(x):
    k = tf.reshape(tf.range(27, dtype=tf.float32), (3, 3, 3, 1)) / 20
    with tf.GradientTape() as tape:
        tape.watch([x, k])
        y = tf.reduce_sum(tf.nn.depthwise_conv2d(x, k, [1, 1, 1, 1], "SAME") ** 2)
    gx, gk = tape.gradient(y, [x, k])
    return tf.concat([tf.reshape(gx, (-1,)), tf.reshape(gk, (-1,))], 0)


def _check(want, got):
    want, got = tf.nest.flatten(want), tf.nest.flatten(got)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        w, g = np.asarray(w), np.asarray(g)
        assert w.shape == g.shape and w.dtype == g.dtype
        if w.dtype.kind == "f":
            scale = max(float(np.max(np.abs(w))), 1e-30) if w.size else 1.0
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL * scale)
        else:
            np.testing.assert_array_equal(g, w)


SEEN = collections.Counter()


def _record_opcodes(bridged, args):
    cf = bridged.concrete(*args)
    module = bridged.hlo_module(cf, *bridged.flat_inputs(cf, args, {}))
    for comp in module.computations:
        for instr in comp.instructions:
            SEEN[instr.opcode] += 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_tensorflow(name):
    fn, args, *expected = CASES[name]
    args = tuple(tf.constant(a) for a in args)
    if expected:
        want = expected[0](*args)
    else:
        want = tf.function(fn, jit_compile=True, autograph=False)(*args)
    bridged = BridgedFunction(tf.function(fn, jit_compile=True, autograph=False))
    got = bridged(*args)
    _check(want, got)
    _record_opcodes(bridged, args)


def test_host_transfers_and_stateful_random():
    """send/recv (infeed/outfeed streams) and `rng` (tf.random.uniform):
    streamed values arrive in order; stateful draws are in range and differ
    between draws."""
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    infeed = Infeed(tf.data.Dataset.from_tensor_slices((data, data[:, 0].astype(np.int32))))
    outfeed = Outfeed()

    def fn(n):
        acc = tf.zeros(4)
        for _ in tf.range(n):
            x, i = infeed.dequeue()
            acc += x * tf.cast(i, tf.float32)
            outfeed.enqueue({"acc": acc, "u": tf.random.uniform((3,))})
        return acc

    bridged = BridgedFunction(tf.function(fn, jit_compile=True))
    got = bridged(3)
    want = sum(data[k] * data[k, 0] for k in range(3))
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL)
    structure, values = outfeed.take()
    flat = tf.nest.flatten(structure)
    assert len(flat) == 2 and len(values[0]) == 3
    accs = np.asarray(values[0])
    np.testing.assert_allclose(accs[-1], want, rtol=RTOL)
    draws = np.asarray(values[1])
    assert draws.shape == (3, 3) and np.all((draws >= 0) & (draws < 1))
    assert len({tuple(d) for d in draws}) == 3
    _record_opcodes(bridged, (3,))


def test_variables_update_in_place_across_calls():
    """Variable writes come back as outputs aliased to their inputs (HLO
    copy of the retvals); the variable holds the new value after each call,
    as TensorFlow's own run does."""
    init = np.arange(6, dtype=np.float32).reshape(2, 3)
    v_tf, v_ipu = tf.Variable(init), tf.Variable(init)
    counter = tf.Variable(0, dtype=tf.int64)

    def make(v):
        def step(x):
            v.assign(v * 0.5 + x)
            return tf.reduce_sum(v)
        return step

    run_tf = tf.function(make(v_tf), jit_compile=True)
    bridged = BridgedFunction(tf.function(make(v_ipu), jit_compile=True))
    for k in range(3):
        x = tf.constant(np.full((2, 3), k, np.float32))
        _check(run_tf(x), bridged(x))
        _check(v_tf.read_value(), v_ipu.read_value())
    _record_opcodes(bridged, (tf.constant(np.zeros((2, 3), np.float32)),))

    def count():
        counter.assign_add(1)

    BridgedFunction(tf.function(count, jit_compile=True))()
    assert int(counter.numpy()) == 1


# Opcodes no TensorFlow op lowers to on the CPU, whose rules are reached
# another way: none.
# TensorFlow's own ops emit none of these on CPU; their rules run on 2 and 4
# replicas in test_collectives_import.py (StableHLO in an XlaCallModule).
NOT_EMITTED = {"all-gather", "all-to-all", "collective-permute"}


def test_every_rule_is_exercised(request):
    if hasattr(request.config, "workerinput"):
        pytest.skip("needs every case of this module in one process")
    ran = {item.name for item in request.session.items if item.module is request.module}
    if len(ran) != len(CASES) + 3:
        pytest.skip("needs every case of this module to run")
    importer._load_rules()
    missing = sorted(set(importer.RULES) - set(SEEN) - NOT_EMITTED)
    assert missing == []

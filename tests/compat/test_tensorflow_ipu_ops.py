"""IPU operators as TensorFlow functions (issue 12, item 4), compiled
through the TensorFlow front end and run on the simulated IPU; the numbers
of Keras' ops of the same name (ipu backend) where Keras has them."""

import numpy as np
import pytest

import keras

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402

X = np.random.default_rng(0).normal(size=(3, 5)).astype("float32") * 3


def on_ipu(fn, *args):
    out = ipu.ipu_compiler.compile(fn, inputs=[tf.constant(a) for a in args])
    return [o.numpy() for o in out]


@pytest.mark.parametrize("approximate", [True, False])
def test_gelu_matches_keras(approximate):
    (out,) = on_ipu(lambda x: ipu.nn_ops.gelu(x, approximate=approximate), X)
    expected = keras.ops.convert_to_numpy(keras.ops.gelu(X, approximate=approximate))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_activations():
    swish, hard, soft, stable = on_ipu(
        lambda x: (ipu.nn_ops.swish(x), ipu.nn_ops.hard_sigmoid(x), ipu.nn_ops.softmax(x),
                   ipu.nn_ops.softmax(x, stable=True)), X)
    np.testing.assert_allclose(swish, keras.ops.convert_to_numpy(keras.ops.silu(X)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hard, np.clip(0.2 * X + 0.5, 0, 1), rtol=1e-6)
    expected = keras.ops.convert_to_numpy(keras.ops.softmax(X, axis=-1))
    np.testing.assert_allclose(soft, expected, rtol=1e-5)
    np.testing.assert_allclose(stable, expected, rtol=1e-5)


def test_segment_sum_graphcore_example_and_checks():
    c = np.array([[1, 2, 3, 4], [4, 3, 2, 1], [5, 6, 7, 8]], "float32")
    (out,) = on_ipu(lambda d, s: ipu.math_ops.segment_sum(d, s, 2), c, np.array([0, 0, 1], "int32"))
    np.testing.assert_array_equal(out, [[5, 5, 5, 5], [5, 6, 7, 8]])
    with pytest.raises(ValueError, match="must be equal"):
        ipu.math_ops.segment_sum(c, tf.constant([0, 1]), 2)


def test_normalise_image_pads_a_fourth_channel():
    image = np.random.default_rng(1).integers(0, 256, (2, 4, 4, 3)).astype("uint8")
    offsets, scales = [0.5, 0.4, 0.3], [2.0, 3.0, 4.0]
    (out,) = on_ipu(lambda im: ipu.image_ops.normalise_image(im, offsets, scales, 1 / 255), image)
    assert out.shape == (2, 4, 4, 4) and out.dtype == np.float16
    expected = (image.astype("float32") / 255 - np.array(offsets)) * np.array(scales)
    np.testing.assert_allclose(out[..., :3], expected, rtol=2e-3, atol=2e-3)
    assert not out[..., 3].any()


def test_replication_index_is_each_replicas_own():
    from keras_ipu.frontends.tensorflow.function import bridge

    outfeed = ipu.ipu_outfeed_queue.IPUOutfeedQueue()

    def step():
        outfeed.enqueue(ipu.replication_ops.replication_index() * 10)

    bridge(step).run((), {}, replicas=2)
    np.testing.assert_array_equal(outfeed.dequeue().numpy(), [[0, 10]])
    (alone,) = on_ipu(lambda: ipu.replication_ops.replication_index())
    assert alone == 0


# -- embedding_ops, math_ops.serialized_matmul -------------------------------

@pytest.mark.parametrize("factor", [1, 4])
def test_embedding_lookup_matches_gather_and_its_gradient_is_a_scatter_add(factor):
    rng = np.random.default_rng(2)
    table = rng.normal(size=(8, 2, 3)).astype("float32")
    ids = np.array([[7, 0, 3], [3, 5, 1]], "int32")

    def lookup_and_grad(t, i):
        with tf.GradientTape() as tape:
            tape.watch(t)
            rows = ipu.embedding_ops.embedding_lookup(t, i, serialization_factor=factor)
            loss = tf.reduce_sum(rows * tf.range(1.0, 7.0)[None, None, None, :1])
        return rows, tape.gradient(loss, t)

    rows, grad = on_ipu(lookup_and_grad, table, ids)
    np.testing.assert_array_equal(rows, table[ids])
    expected = np.zeros_like(table)
    np.add.at(expected, ids.reshape(-1), 1.0)
    np.testing.assert_array_equal(grad, expected)


def test_embedding_lookup_checks_like_graphcore():
    with pytest.raises(ValueError, match=r"serialization_factor \(3\) must divide .* \(8\)"):
        ipu.embedding_ops.embedding_lookup(tf.zeros((8, 2)), tf.constant([1]),
                                           serialization_factor=3)


@pytest.mark.parametrize("dimension", ["a_columns", "a_rows_b_columns", "b_rows"])
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, True)])
def test_serialized_matmul_and_its_gradients_equal_matmul(dimension, transpose_a, transpose_b):
    rng = np.random.default_rng(3)
    a = rng.normal(size=(2, 8, 6) if transpose_a else (2, 6, 8)).astype("float32")
    b = rng.normal(size=(4, 8) if transpose_b else (8, 4)).astype("float32")
    b = np.broadcast_to(b, (2,) + b.shape).copy()

    def run(x, y, serialized):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            if serialized:
                out = ipu.math_ops.serialized_matmul(x, y, 2, dimension, transpose_a, transpose_b)
            else:
                out = tf.linalg.matmul(x, y, transpose_a=transpose_a, transpose_b=transpose_b)
            loss = tf.reduce_sum(out * out)
        return [out] + tape.gradient(loss, [x, y])

    ours = on_ipu(lambda x, y: run(x, y, True), a, b)
    theirs = [t.numpy() for t in run(tf.constant(a), tf.constant(b), False)]
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-5, atol=1e-5)


def test_serialized_matmul_errors():
    a, b = tf.zeros((6, 8)), tf.zeros((8, 4))
    with pytest.raises(ValueError, match=r"'serialization_factor' \(4\) to divide the columns dimension of 'a' \(6\)"):
        ipu.math_ops.serialized_matmul(a, b, 4, "a_columns")
    with pytest.raises(ValueError, match="Invalid serialization_dimension=rows"):
        ipu.math_ops.serialized_matmul(a, b, 2, "rows")


# -- rand_ops.dropout ---------------------------------------------------------

def test_dropout_keeps_the_expected_sum_and_a_seed_fixes_the_mask():
    x = np.ones((64, 64), "float32")
    seeded = lambda v: ipu.rand_ops.dropout(v, seed=[3, 4], rate=0.25)  # noqa: E731
    (first,), (again,) = on_ipu(seeded, x), on_ipu(seeded, x)
    np.testing.assert_array_equal(first, again)
    assert set(np.unique(first)) == {0.0, np.float32(1 / 0.75)}
    assert abs((first == 0).mean() - 0.25) < 0.03  # 4096 draws: 5 sigma is 0.034
    (other,) = on_ipu(lambda v: ipu.rand_ops.dropout(v, seed=[3, 4], rate=0.25,
                                                     seed_modifier=2), x)
    assert not np.array_equal(first, other)
    (rows,) = on_ipu(lambda v: ipu.rand_ops.dropout(v, rate=0.5, noise_shape=[64, 1]), x)
    assert all(len(np.unique(r)) == 1 for r in rows)  # one draw per row
    with pytest.raises(ValueError, match=r"range \[0, 1\)"):
        ipu.rand_ops.dropout(x, rate=1.0)
    with pytest.raises(ValueError, match="Dimension mismatch, 64 != 2"):
        ipu.rand_ops.dropout(tf.constant(x), noise_shape=[2, 64])


# -- nn_ops: CTC, sampled losses, multi_conv -----------------------------------

def test_ctc_losses_match_keras_ctc_on_the_ipu_backend():
    rng = np.random.default_rng(4)
    T, B, C = 7, 2, 5
    logits = rng.normal(size=(T, B, C)).astype("float32")
    labels = np.array([[1, 2, 2], [3, 4, 0]], "int32")
    label_length, logit_length = np.array([3, 2], "int32"), np.array([7, 7], "int32")
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    v2, with_log_probs = on_ipu(
        lambda lg, lp: (ipu.nn_ops.ctc_loss_v2(labels, lg, label_length, logit_length, 0),
                        ipu.nn_ops.ctc_loss_with_log_probs(labels, lp, label_length,
                                                           logit_length, 0)),
        logits, log_probs)
    # keras.ops.ctc_loss (batch major, blank index as mask_index), one label
    # sequence padded with the blank: compare entry by entry.
    for b in range(B):
        expected = keras.ops.convert_to_numpy(keras.ops.ctc_loss(
            labels[b:b + 1, :label_length[b]], np.swapaxes(logits, 0, 1)[b:b + 1],
            label_length[b:b + 1], logit_length[b:b + 1], mask_index=0))
        np.testing.assert_allclose(v2[b], expected[0], rtol=1e-4)
        np.testing.assert_allclose(with_log_probs[b], expected[0], rtol=1e-4)
    with pytest.raises(ValueError, match="out_dtype cannot be float16 when dtype of logits is float32"):
        ipu.nn_ops.ctc_loss_v2(labels, tf.constant(logits), label_length, logit_length, 0,
                               out_dtype=tf.float16)


@pytest.mark.parametrize("loss", ["nce_loss", "sampled_softmax_loss"])
def test_sampled_losses_with_given_samples_match_their_formula(loss):
    rng = np.random.default_rng(5)
    num_classes, dim, batch = 10, 4, 3
    weights = rng.normal(size=(num_classes, dim)).astype("float32")
    biases = rng.normal(size=(num_classes,)).astype("float32")
    inputs = rng.normal(size=(batch, dim)).astype("float32")
    labels = np.array([[1], [4], [1]], "int64")
    sampled = np.array([0, 4, 7], "int64")  # 4 is an accidental hit: kept
    true_q = np.full((batch, 1), 0.3, "float32")
    sampled_q = np.array([0.5, 0.3, 0.1], "float32")
    fn = getattr(ipu.nn_ops, loss)
    (out,) = on_ipu(lambda w, b_, x: fn(w, b_, labels, x, 3, num_classes,
                                        sampled_values=(sampled, true_q, sampled_q)),
                    weights, biases, inputs)
    true_logits = (inputs * weights[labels[:, 0]]).sum(1, keepdims=True) + biases[labels] - np.log(true_q)
    sampled_logits = inputs @ weights[sampled].T + biases[sampled] - np.log(sampled_q)
    logits = np.concatenate([true_logits, sampled_logits], 1)
    targets = np.concatenate([np.ones((batch, 1)), np.zeros((batch, 3))], 1)
    if loss == "nce_loss":
        expected = (np.maximum(logits, 0) - logits * targets
                    + np.log1p(np.exp(-np.abs(logits)))).sum(1)
    else:
        expected = -(targets * (logits - np.log(np.exp(logits).sum(1, keepdims=True)))).sum(1)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_multi_conv_gives_the_convolutions_values():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(1, 6, 6, 2)).astype("float32")
    k1, k2 = (rng.normal(size=(3, 3, 2, 4)).astype("float32") for _ in range(2))

    @ipu.nn_ops.multi_conv(options={"perConvReservedTiles": "50"})
    def convs(a, b):
        return tf.nn.conv2d(a, k1, 1, "SAME"), tf.nn.conv2d(b, k2, 1, "VALID")

    ours = on_ipu(convs, x, x)
    theirs = [tf.nn.conv2d(x, k1, 1, "SAME").numpy(), tf.nn.conv2d(x, k2, 1, "VALID").numpy()]
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="options` to be a `dict`"):
        ipu.nn_ops.multi_conv(lambda a: a, options=["x"])(x)


# -- statistics_ops, slicing_ops --------------------------------------------------

def test_histogram_bins_as_popops():
    rng = np.random.default_rng(7)
    x = rng.normal(size=200).astype("float32")
    levels, hist, updated, absolute = on_ipu(
        lambda v: (ipu.statistics_ops.fixed_width_bins(v, 5),
                   ipu.statistics_ops.histogram(v, [-1.0, 0.0, 1.0]),
                   ipu.statistics_ops.histogram_update(tf.ones(4), v, [-1.0, 0.0, 1.0]),
                   ipu.statistics_ops.histogram(v, [0.5, 1.0], absolute_of_input=True)), x)
    np.testing.assert_allclose(levels, np.linspace(x.min(), x.max(), 5), rtol=1e-6)
    expected = np.histogram(x, [-np.inf, -1, 0, 1, np.inf])[0]
    np.testing.assert_array_equal(hist, expected)
    np.testing.assert_array_equal(updated, expected + 1)
    a = np.abs(x)
    np.testing.assert_array_equal(absolute, [(a < 0.5).sum(), ((a >= 0.5) & (a < 1)).sum(),
                                             (a >= 1).sum()])
    with pytest.raises(ValueError, match="For n levels, hist must have n\\+1 elements"):
        ipu.statistics_ops.histogram_update(tf.ones(3), x, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="Only float16 and float32"):
        ipu.statistics_ops.histogram(np.arange(3), [1.0])


def test_sequence_slices_graphcore_examples():
    src = np.repeat(np.arange(6, dtype="float32")[:, None], 6, 1)
    num_elems = np.array([2, 2], "int32")
    sliced, unpacked, packed, kept = on_ipu(
        lambda s, n, so, do: (
            ipu.slicing_ops.sequence_slice(tf.zeros([6, 6]), s, n, so, do, True),
            ipu.slicing_ops.sequence_slice_unpack(s, n, so, 4),
            ipu.slicing_ops.sequence_slice_pack(
                tf.zeros([6, 6]), ipu.slicing_ops.sequence_slice_unpack(s, n, so, 4), n, so,
                False),
            ipu.slicing_ops.sequence_slice(tf.fill([6, 6], 9.0), s, n, so, do, False)),
        src, num_elems, np.array([2, 1], "int32"), np.array([0, 4], "int32"))
    np.testing.assert_array_equal(sliced[:, 0], [2, 3, 0, 0, 1, 2])
    np.testing.assert_array_equal(unpacked[:, 0], [2, 3, 1, 2])
    np.testing.assert_array_equal(packed[:, 0], [0, 1, 2, 3, 0, 0])  # runs overlap: the last wins
    np.testing.assert_array_equal(kept[:, 0], [2, 3, 9, 9, 1, 2])
    with pytest.raises(ValueError, match="matching, nonzero shapes of rank 1"):
        ipu.slicing_ops.sequence_slice(src, src, [1], [0, 1], [0], False)


# -- functional_ops, control_flow_ops, internal_ops -------------------------------

def test_outlined_function_barrier_and_remap_keep_the_values():
    calls = []

    @ipu.functional_ops.outlined_function
    def block(v):
        calls.append(1)
        return tf.nn.relu(v) * 2.0

    def net(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = block(block(v) - 1.0)
            f, g = ipu.control_flow_ops.barrier([y, v], insert_barrier_for_gradients=True)
            out = ipu.internal_ops.remap(f) + ipu.internal_ops.remap_deduce(g)
            loss = tf.reduce_sum(out)
        return out, tape.gradient(loss, v)

    out, grad = on_ipu(net, X)
    expected = np.maximum(np.maximum(X, 0) * 2 - 1, 0) * 2 + X
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    inner = np.maximum(X, 0) * 2 - 1
    np.testing.assert_allclose(grad, (inner > 0) * 2 * (X > 0) * 2 + 1, rtol=1e-6)
    assert len(calls) == 1  # one body, traced once, called twice


# -- within_replica_ops ---------------------------------------------------------

def test_within_replica_all_reduce_pads_and_all_gather_concatenates():
    a = np.array([1.0, 2.0], "float32")
    b = np.array([3.0, 4.0, 5.0], "float32")
    c = np.array([10.0, 20.0, 30.0], "float32")
    summed = on_ipu(lambda x, y, z: ipu.within_replica_ops.all_reduce([x, y, z], "COLLECTIVE_OP_ADD"),
                    a, b, c)
    assert len(summed) == 3
    for s in summed:
        np.testing.assert_array_equal(s, [14.0, 26.0, 35.0])
    (largest, _, _) = on_ipu(
        lambda x, y, z: ipu.within_replica_ops.all_reduce([x, y, z], "COLLECTIVE_OP_MAX"), a, b, c)
    np.testing.assert_array_equal(largest, [10.0, 20.0, 30.0])
    m1, m2 = (np.arange(6, dtype="float32").reshape(2, 3) + k for k in (0, 10))
    gathered = on_ipu(lambda x, y: ipu.within_replica_ops.all_gather([x, y], axis=1), m1, m2)
    for g in gathered:
        np.testing.assert_array_equal(g, np.concatenate([m1, m2], axis=1))
    with pytest.raises(ValueError, match="duplicate entries"):
        t = tf.constant(a)
        ipu.within_replica_ops.all_reduce([t, t], "COLLECTIVE_OP_ADD")


def _scatter(op, *shards):
    return [list(r) for r in on_ipu(
        lambda *xs: ipu.within_replica_ops.reduce_scatter(list(xs), op), *shards)]


def test_within_replica_reduce_scatter_deals_the_reduced_elements_from_the_last():
    # Graphcore's within_replica_ops_test cases, expected values by hand:
    # shard s holds reduced elements n-1-s, n-1-s-k, ..., then zeros.
    x = [np.array([1.0, 2.0, 3.0], "float32") * 10 ** i for i in range(4)]
    # The reference's example (3 elements, 4 shards): the same chunks
    # [x], [y], [z], [0] (Graphcore places them 0/y/z/x).
    assert _scatter("COLLECTIVE_OP_ADD", *x) == [[3333.0], [2222.0], [1111.0], [0.0]]
    five = [np.arange(1, 6, dtype="int32") * k for k in (1, 2, 3, 4)]
    # 5 elements over 4 shards: ceil(5 / 4) = 2 each, one shard gets two.
    assert _scatter("COLLECTIVE_OP_ADD", *five) == [[50, 10], [40, 0], [30, 0], [20, 0]]
    two = [np.array([1, 2], "int32") * k for k in (1, 2, 3, 4)]
    assert _scatter("COLLECTIVE_OP_ADD", *two) == [[20], [10], [0], [0]]
    # Mixed sizes are zero-padded: [2, 0] + [1, 1]; scalars are [1].
    assert _scatter("COLLECTIVE_OP_ADD", np.array([2], "int32"),
                    np.array([1, 1], "int32")) == [[1], [3]]
    assert _scatter("COLLECTIVE_OP_MUL", np.array([2, 3], "float32"),
                    np.array([5, 7], "float32")) == [[21.0], [10.0]]
    assert _scatter("COLLECTIVE_OP_MAX", np.float32(4), np.float32(9)) == [[9.0], [0.0]]
    a, b = np.array([False, True]), np.array([True, True])
    assert _scatter("COLLECTIVE_OP_LOGICAL_AND", a, b) == [[True], [False]]
    assert _scatter("COLLECTIVE_OP_LOGICAL_OR", a, b) == [[True], [True]]
    with pytest.raises(ValueError, match="rank 0 or 1"):
        ipu.within_replica_ops.reduce_scatter(
            [tf.zeros([1, 2, 3]), tf.ones([1, 2, 3])], "COLLECTIVE_OP_ADD")
    with pytest.raises(ValueError, match="same type"):
        ipu.within_replica_ops.reduce_scatter(
            [tf.zeros([2]), tf.zeros([2], tf.int32)], "COLLECTIVE_OP_ADD")


def test_within_replica_reduce_scatter_gradient():
    # Graphcore's testGrad: [1, 1] and [2, 2] reduce to [3], [3]; the loss
    # sum_s mean(r_s ** 2) gives each input element 2 * 3.
    def net(s0, s1):
        with tf.GradientTape() as tape:
            tape.watch([s0, s1])
            r = ipu.within_replica_ops.reduce_scatter([s0, s1], "COLLECTIVE_OP_ADD")
            loss = tf.reduce_mean(r[0] ** 2) + tf.reduce_mean(r[1] ** 2)
        return tape.gradient(loss, [s0, s1])

    g0, g1 = on_ipu(net, np.array([1.0, 1.0], "float32"), np.array([2.0, 2.0], "float32"))
    np.testing.assert_array_equal(g0, [6.0, 6.0])
    np.testing.assert_array_equal(g1, [6.0, 6.0])
    # Unequal values: shard 0 holds element 1, shard 1 element 0, so the
    # loss 3 * r_0 + r_1 gives element 1 the weight 3.
    def weighted(s0, s1):
        with tf.GradientTape() as tape:
            tape.watch([s0, s1])
            r = ipu.within_replica_ops.reduce_scatter([s0, s1], "COLLECTIVE_OP_ADD")
            loss = 3.0 * tf.reduce_sum(r[0]) + tf.reduce_sum(r[1])
        return tape.gradient(loss, [s0, s1])

    g0, g1 = on_ipu(weighted, np.array([1.0, 5.0], "float32"), np.array([2.0, 7.0], "float32"))
    np.testing.assert_array_equal(g0, [1.0, 3.0])
    np.testing.assert_array_equal(g1, [1.0, 3.0])


# -- normalization_ops ----------------------------------------------------------

def popnn_group_norm(x, groups, epsilon=1e-6):
    """NumPy: channel c in group c % groups, statistics per example over the
    spatial dims and the group's channels (channels last)."""
    n, c = x.shape[0], x.shape[-1]
    g = x.reshape(n, -1, c // groups, groups)
    mean = g.mean(axis=(1, 2), keepdims=True)
    var = g.var(axis=(1, 2), keepdims=True)
    return ((g - mean) / np.sqrt(var + epsilon)).reshape(x.shape)


@pytest.mark.parametrize("which,groups", [("group_norm", 2), ("layer_norm", 1),
                                          ("instance_norm", 4)])
def test_normalization_ops_match_popnn_grouping_and_keras_layer(which, groups):
    from keras_ipu.estimators.variable_store import VariableStore

    x = np.random.default_rng(8).normal(size=(2, 3, 3, 4)).astype("float32") * 3 + 1
    store = VariableStore()
    kwargs = {"groups": groups} if which == "group_norm" else {}
    init = {"gamma": tf.compat.v1.constant_initializer([1.0, 2.0, 3.0, 4.0]),
            "beta": tf.compat.v1.constant_initializer([0.5, 0.0, -0.5, 1.0])}

    def fn(v):
        with store.trace():
            return getattr(ipu.normalization_ops, which)(v, param_initializers=init, **kwargs)

    (out,) = on_ipu(fn, x)
    expected = popnn_group_norm(x, groups) * [1.0, 2.0, 3.0, 4.0] + [0.5, 0.0, -0.5, 1.0]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    if which == "group_norm":
        layer = ipu.layers.GroupNormalization(groups=groups, epsilon=1e-6)
        layer.build(x.shape)
        values = {"gamma": [1.0, 2.0, 3.0, 4.0], "beta": [0.5, 0.0, -0.5, 1.0]}
        for w in layer.weights:
            w.assign(np.array(values[w.name], "float32"))
        np.testing.assert_allclose(out, keras.ops.convert_to_numpy(layer(x)), rtol=1e-4, atol=1e-4)


def test_normalization_ops_checks():
    with pytest.raises(ValueError, match="6 channels is not commensurate with 4 groups"):
        ipu.normalization_ops.group_norm(tf.zeros((1, 2, 6)), groups=4)
    with pytest.raises(ValueError, match="only supports NCHW"):
        ipu.normalization_ops.group_norm(tf.zeros((1, 2, 6, 3)), channels_axis=2)


def test_codelet_expression_op_graphcore_example_and_no_gradient():
    a, b, c = (np.arange(6, dtype="float32").reshape(2, 3) + k for k in range(3))

    def my_custom_op(x, y, z):
        return x * x + y * z

    (out,) = on_ipu(lambda x, y, z: ipu.custom_ops.codelet_expression_op(my_custom_op, x, y, z),
                    a, b, c)
    np.testing.assert_allclose(out, a * a + b * c, rtol=1e-6)

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = ipu.custom_ops.codelet_expression_op(lambda t: t * 2, x)
        return tape.gradient(y, x)

    with pytest.raises(LookupError, match="codelet_expression_op has no gradient"):
        ipu.ipu_compiler.compile(step, inputs=[tf.constant(a)])

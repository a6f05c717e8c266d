"""Tensor parallelism (compiler/tensor_parallel.py): a program whose weights
are split over the IPUs of a mesh axis computes the same values, and its
prediction is that of one IPU's part (Megatron's column- and row-parallel
layers, with the one all-reduce of the row-parallel layer), checked by hand.

The 2-layer MLP: x [64, 32] -> dense_1 [32, 64] (split on its columns),
relu -> dense_2 [64, 16] (split on its rows) -> squared error with y."""

import numpy as np
import pytest

import keras

from keras_ipu.device import autodiff
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device.compiler.tensor_parallel import PARTIAL
from keras_ipu.device.compiler.tensor_parallel import TensorParallel
from keras_ipu.device.jit import jit
from keras_ipu.device.simulator import cost_model
from keras_ipu.device.simulator import targets

B, IN, HIDDEN, OUT = 64, 32, 64, 16
LAYOUTS = {0: 1, 1: 0}  # dense_1/kernel (None, "model"), dense_2/kernel ("model", None)
NAMES = {0: "dense_1/kernel", 1: "dense_2/kernel"}


def _loss(w1, w2, x, y):
    h = keras.ops.relu(x @ w1)
    return keras.ops.mean((h @ w2 - y) ** 2)


def _args(batch=B):
    rng = np.random.default_rng(7)
    return [rng.normal(size=s).astype(np.float32)
            for s in ((IN, HIDDEN), (HIDDEN, OUT), (batch, IN), (batch, OUT))]


def _split_as_whole(fn, layouts, *args, k=2):
    """The Partitioned program of `fn` split over k IPUs as `layouts` say,
    after checking the split run gives the unsplit run's values."""
    split = jit(fn, options=CompileOptions(tensor_parallel=TensorParallel.of(k, layouts)))
    np.testing.assert_array_equal(np.asarray(jit(fn)(*args)), np.asarray(split(*args)))
    return split.executable(*args).tensor_parallel.partitioned


def _grad_step(ipus=None, fn=_loss, layouts=LAYOUTS):
    options = CompileOptions() if ipus is None else CompileOptions(
        tensor_parallel=TensorParallel.of(ipus, layouts, NAMES))
    return jit(autodiff.grad(fn, argnums=(0, 1)), options=options)


@pytest.mark.parametrize("k", [2, 4])
def test_values_equal_the_unsplit_run(k):
    args = _args()
    whole = _grad_step()(*args)
    split = _grad_step(k)(*args)
    for a, b in zip(whole, split):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("k", [2, 4])
def test_megatron_layouts_need_one_all_reduce(k):
    exe = _grad_step(k).executable(*_args())
    part = exe.tensor_parallel.partitioned
    # Inputs: the two kernels split as laid out, x and y whole; the
    # gradients come out split like their kernels (no collective for them).
    assert part.input_shardings == (1, 0, None, None)
    assert part.output_shardings == (1, 0)
    # Forward: x @ w1 is column-parallel (h split on its columns), h @ w2
    # row-parallel (partial sums): one all-reduce of the [64, 16] float32
    # output, 4,096 bytes. Backward: dh = dy @ w2^T and dw1 = x^T @ dh are
    # split, dw2 = h^T @ dy too: nothing more crosses the links.
    [(kind, nbytes, count)] = [(c.kind, c.nbytes, c.count) for c in part.collectives]
    assert (kind, nbytes, count) == ("all-reduce", 4096, 1)


@pytest.mark.parametrize("k, weight_bytes", [(2, (4096, 2048)), (4, (2048, 1024))])
def test_each_ipu_holds_its_block_of_the_weights(k, weight_bytes):
    exe = _grad_step(k).executable(*_args())
    # dense_1/kernel 32 x 64 x 4 B = 8,192 B, dense_2/kernel 64 x 16 x 4 B =
    # 4,096 B: 1/k of each on every IPU.
    held = exe.tensor_parallel.partitioned.sharded_input_bytes(exe.graph)
    assert held == {0: (8192, weight_bytes[0]), 1: (4096, weight_bytes[1])}
    # x (8,192 B) and y (4,096 B) whole on every IPU.
    assert sorted(exe.memory_by_ipu) == list(range(k))
    for report in exe.memory_by_ipu.values():
        assert report.input_bytes == sum(weight_bytes) + 8192 + 4096
    whole = _grad_step().executable(*_args())
    assert whole.memory.input_bytes == 8192 + 4096 + 8192 + 4096


@pytest.mark.parametrize("k, link_bytes, link_steps, link_cycles", [
    # [RING]: 2 (k - 1) / k x 4,096 B each IPU sends, in 2 (k - 1) steps;
    # cycles: bytes / 320 GB/s x 1.33 GHz (ipu2), rounded up.
    (2, 4096, 2, 18),  # 4096 / 320e9 * 1.33e9 = 17.02
    (4, 6144, 6, 26),  # 6144 / 320e9 * 1.33e9 = 25.54
])
def test_the_all_reduce_is_costed_over_the_ipu_links(k, link_bytes, link_steps, link_cycles):
    exe = _grad_step(k).executable(*_args())
    pred = exe.prediction
    [step] = [s for s in pred.steps if s.name == "cross_replica_sum"]
    assert cost_model.all_reduce_link_traffic(4096, k) == (link_bytes, link_steps)
    target = targets.get_target("ipu2")
    assert exe.target.name == target.name
    assert step.exchange == link_cycles
    assert step.sync == link_steps * cost_model.INTER_IPU_SYNC_CYCLES + cost_model.SYNC_CYCLES
    assert pred.ipu_cycles == {ipu: pred.cycles for ipu in range(k)}


@pytest.mark.parametrize("k", [2, 4])
def test_each_ipu_does_one_kth_of_the_matmuls(k):
    # Forward 2·64·32·64 + 2·64·64·16, backward dh 2·64·16·64, dw2
    # 2·64·64·16, dw1 2·32·64·64: 917,504 FLOPs, each product split k ways.
    def matmul_flops(exe):
        pred = exe.prediction
        return sum(s.flops for s in pred.steps if s.name == "dot_general")

    assert matmul_flops(_grad_step().executable(*_args())) == 917_504
    assert matmul_flops(_grad_step(k).executable(*_args())) == 917_504 // k


def test_one_ipu_axis_predicts_the_unsplit_program():
    args = _args()
    assert _grad_step(1).executable(*args).prediction.cycles == \
        _grad_step().executable(*args).prediction.cycles


def test_a_split_that_does_not_divide_the_dimension_is_refused():
    args = _args()
    with pytest.raises(ValueError) as info:
        _grad_step(3).executable(*args)
    message = str(info.value)
    assert "dense_1/kernel f32[32,64]" in message  # the value
    assert "64 is not a multiple of 3" in message  # the rule
    assert "mesh axis whose size divides 64" in message  # the fix


def test_an_op_without_a_rule_reads_its_operand_whole():
    def sorted_loss(w1, w2, x, y):
        h = keras.ops.sort(keras.ops.relu(x @ w1), axis=-1)
        return keras.ops.mean((h @ w2 - y) ** 2)

    args = _args()
    exe = _grad_step(2, sorted_loss).executable(*args)
    kinds = [c.kind for c in exe.tensor_parallel.collectives]
    # sort has no split form: h is all-gathered (64 x 64 x 4 B) before it.
    assert ("all-gather", 16384) in [(c.kind, c.nbytes) for c in exe.tensor_parallel.collectives]
    assert "all-gather" in kinds
    for a, b in zip(_grad_step(None, sorted_loss)(*args), _grad_step(2, sorted_loss)(*args)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_optimizer_slots_of_a_split_weight_are_split_too():
    def update(w1, m1, x, y):
        def loss(w):
            return keras.ops.mean((x @ w - y) ** 2)

        g = autodiff.grad(loss)(w1)
        m = 0.9 * m1 + g
        return w1 - 0.1 * m, m

    rng = np.random.default_rng(1)
    args = [rng.normal(size=s).astype(np.float32) for s in ((IN, OUT), (IN, OUT), (B, IN),
                                                            (B, OUT))]
    options = CompileOptions(tensor_parallel=TensorParallel.of(2, {0: 1}))
    exe = jit(update, options=options).executable(*args)
    part = exe.tensor_parallel.partitioned
    # The momentum m1 had no layout: its readers add it to the split
    # gradient. y is read only against the split x @ w: each IPU needs its
    # columns of y alone, so it is streamed split too.
    assert part.inferred == (1, 3)
    assert part.input_shardings == (1, 1, None, 1)
    assert part.output_shardings == (1, 1)
    assert part.collectives == []


def test_reduce_over_a_split_dimension_is_a_partial_sum():
    def total(w1, x):
        return keras.ops.sum(x @ w1, axis=1)

    args = _args()
    options = CompileOptions(tensor_parallel=TensorParallel.of(2, {0: 1}))
    exe = jit(total, options=options).executable(args[0], args[2])
    part = exe.tensor_parallel.partitioned
    # The partial sums leave the program summed: one all-reduce of [64] float32.
    assert [(c.kind, c.nbytes) for c in part.collectives] == [("all-reduce", 256)]
    assert part.output_shardings == (None,)
    assert PARTIAL not in part.output_shardings


def test_convolutions_split_on_output_then_input_channels():
    # conv_a's kernel split on its output channels (column-parallel): its
    # output is split on the channels; conv_b's kernel split on its input
    # channels (row-parallel): partial sums, one all-reduce of its output
    # [2, 8, 8, 4] float32 = 2,048 B.
    def convs(ka, kb, x):
        h = keras.ops.relu(keras.ops.conv(x, ka, padding="same"))
        return keras.ops.conv(h, kb, padding="same")

    rng = np.random.default_rng(3)
    ka, kb, x = (rng.normal(size=s).astype(np.float32)
                 for s in ((3, 3, 4, 8), (3, 3, 8, 4), (2, 8, 8, 4)))
    whole = jit(convs)
    split = jit(convs, options=CompileOptions(
        tensor_parallel=TensorParallel.of(2, {0: 3, 1: 2})))
    np.testing.assert_array_equal(np.asarray(whole(ka, kb, x)), np.asarray(split(ka, kb, x)))
    exe = split.executable(ka, kb, x)
    part = exe.tensor_parallel.partitioned
    assert [(c.kind, c.nbytes) for c in part.collectives] == [("all-reduce", 2048)]

    def conv_flops(exe):
        return [s.flops for s in exe.prediction.steps if s.name == "conv_general_dilated"]

    # Each conv: 2 x (2·8·8 outputs x channels out) x (3·3 x channels in)
    # MACs; per IPU half of each.
    assert conv_flops(whole.executable(ka, kb, x)) == [2 * 128 * 8 * 36, 2 * 128 * 4 * 72]
    assert conv_flops(exe) == [128 * 8 * 36, 128 * 4 * 72]


def test_heads_reshaped_and_transposed_keep_their_split():
    # Attention-style: the projection's 64 columns as 4 heads of 16; the
    # split stays on the heads through the reshape and the transpose, and
    # the sum over the heads is a partial sum: one all-reduce of [64, 16].
    def heads(w, x):
        h = keras.ops.reshape(x @ w, (B, 4, 16))
        return keras.ops.sum(keras.ops.transpose(h, (0, 2, 1)), axis=2)

    args = _args()
    for k in (2, 4):
        split = jit(heads, options=CompileOptions(
            tensor_parallel=TensorParallel.of(k, {0: 1})))
        np.testing.assert_array_equal(np.asarray(jit(heads)(args[0], args[2])),
                                      np.asarray(split(args[0], args[2])))
        part = split.executable(args[0], args[2]).tensor_parallel.partitioned
        assert [(c.kind, c.nbytes) for c in part.collectives] == [("all-reduce", 4096)]
        shapes = [n.outputs[0].aval.shape for n in part.local.nodes
                  if n.primitive.name in ("reshape", "transpose")]
        assert shapes == [(B, 4 // k, 16), (B, 16, 4 // k)]


def test_an_embedding_split_on_its_features_looks_up_split_rows():
    # Table [100, 32] split on its 32 features; the lookup's rows [64, 32]
    # and the gradient's scatter-add into the table stay split: no collective
    # until the sum over the features (partial sums, all-reduce of [64]).
    def lookup(table, ids):
        return keras.ops.sum(keras.ops.take(table, ids, axis=0) ** 2, axis=1)

    def step(table, ids):
        return autodiff.grad(lambda t: keras.ops.sum(lookup(t, ids)))(table)

    rng = np.random.default_rng(4)
    table = rng.normal(size=(100, 32)).astype(np.float32)
    ids = rng.integers(0, 100, size=(64,)).astype(np.int32)
    options = CompileOptions(tensor_parallel=TensorParallel.of(2, {0: 1}))
    np.testing.assert_array_equal(np.asarray(jit(lookup)(table, ids)),
                                  np.asarray(jit(lookup, options=options)(table, ids)))
    np.testing.assert_array_equal(np.asarray(jit(step)(table, ids)),
                                  np.asarray(jit(step, options=options)(table, ids)))
    part = jit(lookup, options=options).executable(table, ids).tensor_parallel.partitioned
    assert [(c.kind, c.nbytes) for c in part.collectives] == [("all-reduce", 256)]
    grads = jit(step, options=options).executable(table, ids).tensor_parallel.partitioned
    assert grads.collectives == [] and grads.output_shardings == (1,)


def test_the_profile_report_shows_one_ipus_part(monkeypatch, tmp_path):
    import glob
    import json

    from keras_ipu.device.simulator import profile

    monkeypatch.setenv(profile.ENV_VAR, '{"autoReport.all":"true","autoReport.directory":"%s"}'
                       % tmp_path)
    # A batch no other test compiles (a cached program writes no report).
    exe = _grad_step(2).executable(*_args(batch=48))
    [path] = glob.glob(str(tmp_path / "*.json"))
    with open(path) as f:
        report = json.load(f)
    # One IPU of the axis: its inputs are its blocks of the kernels (4,096 +
    # 2,048 B) and the whole x and y (6,144 + 3,072 B), as memory_by_ipu says.
    [ipu] = report["memory"]["ipus"]
    assert ipu["inputs"] == 4096 + 2048 + 6144 + 3072 == exe.memory_by_ipu[1].input_bytes


def test_partial_sums_meeting_a_split_value_are_reduce_scattered():
    # h @ w2 (w2 split on its rows) is a partial [64, 16]; added to x @ w3
    # (w3 split on its columns), split on its columns: each IPU needs only
    # its columns of the sum, a reduce-scatter of the 4,096 B partials.
    def mixed(w2, w3, h, x):
        return h @ w2 + x @ w3

    rng = np.random.default_rng(9)
    args = [rng.normal(size=s).astype(np.float32)
            for s in ((HIDDEN, OUT), (IN, OUT), (B, HIDDEN), (B, IN))]
    options = CompileOptions(tensor_parallel=TensorParallel.of(2, {0: 0, 1: 1}))
    split = jit(mixed, options=options)
    np.testing.assert_array_equal(np.asarray(jit(mixed)(*args)), np.asarray(split(*args)))
    part = split.executable(*args).tensor_parallel.partitioned
    assert [(c.kind, c.nbytes) for c in part.collectives] == [("reduce-scatter", 4096)]
    assert part.output_shardings == (1,)
    [step] = [s for s in split.executable(*args).prediction.steps
              if s.name == "cross_replica_reduce_scatter"]
    # [RING]: (k - 1) / k x 4,096 B = 2,048 B in k - 1 = 1 step:
    # 2048 / 320e9 * 1.33e9 = 8.5 -> 9 cycles.
    assert cost_model.reduce_scatter_link_traffic(4096, 2) == (2048, 1)
    assert step.exchange == 9


def test_a_reshape_keeps_a_split_only_where_blocks_stay_contiguous():
    # Flattening [64, 64] split on its columns interleaves the blocks: the
    # columns are all-gathered (16,384 B) first. Flattening a kernel split on
    # its rows keeps each IPU's rows contiguous: no collective.
    def flat_columns(w, x):
        return keras.ops.reshape(x @ w, (-1,)) * 2.0

    def flat_rows(w):
        return keras.ops.reshape(w, (-1,)) * 2.0

    args = _args()
    cols = jit(flat_columns, options=CompileOptions(
        tensor_parallel=TensorParallel.of(2, {0: 1}))).executable(args[0], args[2])
    assert [(c.kind, c.nbytes) for c in cols.tensor_parallel.collectives] == [
        ("all-gather", 16384)]
    rows = jit(flat_rows, options=CompileOptions(
        tensor_parallel=TensorParallel.of(2, {0: 0}))).executable(args[0])
    assert rows.tensor_parallel.collectives == []
    assert rows.tensor_parallel.partitioned.output_shardings == (0,)


def test_tensor_parallelism_with_pipeline_stages_is_not_implemented():
    from keras_ipu.device.compiler.placement import Placement

    options = CompileOptions(placement=Placement.of({"model/dense_1": 0}),
                             tensor_parallel=TensorParallel.of(2, LAYOUTS))
    with pytest.raises(NotImplementedError, match="cannot also be placed in pipeline stages"):
        jit(autodiff.grad(_loss, argnums=(0, 1)), options=options).executable(*_args())


def test_loops_and_branches_carry_a_split():
    # A while loop updating a split weight three times, then a cond picking
    # one of two elementwise maps of it: the weight stays split throughout,
    # nothing crosses the links, the values are the unsplit program's.
    def program(w, x):
        def body(i, v):
            return i + 1, v - 0.1 * keras.ops.tanh(v)

        _, w = keras.ops.while_loop(lambda i, v: i < 3, body, (0, w))
        w = keras.ops.cond(keras.ops.sum(x) > 0, lambda: w * 2.0, lambda: w + 1.0)
        return x @ w

    args = _args()
    part = _split_as_whole(program, {0: 1}, args[0], args[2])
    assert part.collectives == []
    assert part.output_shardings == (1,)
    kinds = {n.primitive.name for n in part.local.nodes}
    assert {"while_loop", "cond"} <= kinds


# -- an embedding split on its vocabulary (Megatron's vocabulary-parallel lookup)
VOCAB, FEATURES, IDS = 100, 32, 64


def _embedding_args():
    rng = np.random.default_rng(4)
    table = rng.normal(size=(VOCAB, FEATURES)).astype(np.float32)
    # Negative ids count from the end, as the whole lookup wraps them.
    ids = rng.integers(-VOCAB, VOCAB, size=(IDS,)).astype(np.int32)
    return table, ids


def _sgd_on_lookup(table, ids):
    def loss(t):
        return keras.ops.sum(keras.ops.take(t, ids, axis=0) ** 2)

    return table - 0.1 * autodiff.grad(loss)(table)


def _vocabulary_split(k):
    return CompileOptions(tensor_parallel=TensorParallel.of(k, {0: 0}, {0: "embeddings"}))


@pytest.mark.parametrize("k, link_bytes, link_steps, link_cycles", [
    # The lookup's rows [64, 32] float32 = 8,192 B. [RING]: 2 (k - 1) / k x
    # 8,192 B in 2 (k - 1) steps; cycles: bytes / 320 GB/s x 1.33 GHz (ipu2).
    (2, 8192, 2, 35),  # 8192 / 320e9 * 1.33e9 = 34.05
    (4, 12288, 6, 52),  # 12288 / 320e9 * 1.33e9 = 51.07
])
def test_an_embedding_split_on_its_vocabulary_looks_up_its_own_rows(
        k, link_bytes, link_steps, link_cycles):
    table, ids = _embedding_args()
    split = jit(_sgd_on_lookup, options=_vocabulary_split(k))
    np.testing.assert_array_equal(np.asarray(jit(_sgd_on_lookup)(table, ids)),
                                  np.asarray(split(table, ids)))
    exe = split.executable(table, ids)
    part = exe.tensor_parallel.partitioned
    # The table 100 x 32 x 4 B = 12,800 B: 1/k of its rows on each IPU, and
    # the updated table leaves split: the gradient's scatter added only the
    # rows of each IPU's own ids into its block.
    assert part.sharded_input_bytes(exe.graph) == {0: (12800, 12800 // k)}
    assert part.input_shardings == (0, None) and part.output_shardings == (0,)
    for report in exe.memory_by_ipu.values():
        assert report.input_bytes == 12800 // k + IDS * 4
    local = {n.primitive.name: n for n in part.local.nodes}
    assert local["gather"].inputs[0].aval.shape == (VOCAB // k, FEATURES)
    assert local["scatter"].outputs[0].aval.shape == (VOCAB // k, FEATURES)
    # Each IPU's rows are a partial sum of the lookup: one all-reduce of
    # them (the square reads them whole), no all-gather of the table.
    assert [(c.kind, c.nbytes, c.count) for c in part.collectives] == [("all-reduce", 8192, 1)]
    assert cost_model.all_reduce_link_traffic(8192, k) == (link_bytes, link_steps)
    [step] = [s for s in exe.prediction.steps if s.name == "cross_replica_sum"]
    assert step.exchange == link_cycles


def _rows_before_the_all_reduce(program, args, options):
    """Each IPU's partial rows: the local program run up to its all-reduce
    with that IPU's block of the table and its index on the axis."""
    from keras_ipu.device.interpreter import eval_graph
    from keras_ipu.device.ir import Graph
    from keras_ipu.device.simulator import replicas

    part = program.executable(*args).tensor_parallel.partitioned
    k = part.tp.ipus
    [reduce] = [n for n in part.local.nodes if n.primitive.name == "cross_replica_sum"]
    prefix = Graph()
    prefix.inputs = part.local.inputs
    prefix.nodes = part.local.nodes[:part.local.nodes.index(reduce)]
    prefix.outputs = list(reduce.inputs)
    table = args[0]
    rows = []
    for i in range(k):
        block = np.split(table, k, axis=0)[i]
        original = replicas.replica_index
        replicas.replica_index = lambda: i
        try:
            [partial] = eval_graph(prefix, block, *args[1:])
        finally:
            replicas.replica_index = original
        rows.append(np.asarray(partial))
    return rows


@pytest.mark.parametrize("k", [2, 4])
def test_each_ipu_looks_up_the_ids_of_its_rows_and_zeros_for_the_others(k):
    # The local program is one SPMD program: IPU i's rows are the table's
    # rows for the ids in [i V/k, (i+1) V/k) (negative ids wrapped first)
    # and zeros elsewhere; their sum is the whole lookup.
    table, ids = _embedding_args()
    lookup = jit(lambda t, i: keras.ops.take(t, i, axis=0) * 2.0,
                 options=_vocabulary_split(k))
    rows = _rows_before_the_all_reduce(lookup, (table, ids), _vocabulary_split(k))
    wrapped = ids % VOCAB
    for i, partial in enumerate(rows):
        mine = (wrapped // (VOCAB // k)) == i
        np.testing.assert_array_equal(partial[mine], table[wrapped[mine]])
        assert not partial[~mine].any()
    np.testing.assert_array_equal(sum(rows), table[wrapped])


def test_a_vocabulary_split_keras_embedding_trains_its_rows_and_slots_on_their_ipus():
    import keras_ipu as ipu
    from keras.distribution import DeviceMesh
    from keras.distribution import LayoutMap
    from keras.distribution import ModelParallel

    def model():
        keras.utils.set_random_seed(2)
        tokens = keras.Input((8,), dtype="int32")
        h = keras.layers.Embedding(64, 16, name="emb")(tokens)
        out = keras.layers.Dense(3, name="head")(keras.layers.Flatten()(h))
        m = keras.Model(tokens, out)
        m.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    rng = np.random.default_rng(0)
    x = rng.integers(0, 64, size=(16, 8)).astype("int32")
    y = rng.integers(0, 3, size=(16,)).astype("int32")
    whole = model()
    whole.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)

    config = ipu.config.IPUConfig()
    config.auto_select_ipus = 2
    config.configure_ipu_system()
    mesh = DeviceMesh((1, 2), ["batch", "model"], keras.distribution.list_devices())
    layout_map = LayoutMap(mesh)
    layout_map[".*emb/embeddings"] = ("model", None)
    with ModelParallel(layout_map=layout_map).scope():
        split = model()
        split.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for ours, theirs in zip(split.get_weights(), whole.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    [exe] = split.train_function.execution.device_loop.executables()
    part = exe.tensor_parallel.partitioned
    names = dict(part.tp.names)
    # (Without the optimizer's own name, which counts the optimizers made.)
    held = {names[j].split("/")[-1]: b for j, b in part.sharded_input_bytes(exe.graph).items()}
    # The table 64 x 16 x 4 B = 4,096 B and Adam's two slots of it (no
    # layout given: they are updated from the split gradient), half on each.
    assert held == {"embeddings": (4096, 2048), "emb_embeddings_momentum": (4096, 2048),
                    "emb_embeddings_velocity": (4096, 2048)}
    # The rows [8, 8, 16] float32 (4,096 B) are all-reduced once, before the
    # flatten; nothing else crosses the links.
    assert [(c.kind, c.nbytes) for c in part.collectives] == [("all-reduce", 4096)]


# -- the partitioner's own costs ---------------------------------------------------


def test_a_value_read_twice_by_each_op_is_asked_for_once(monkeypatch):
    # x -> x * x -> ... (12 squarings, each reading its operand twice) meets
    # the split w: the request for w's split walks back through the chain
    # to x once per value, not twice per level (2^12 times).
    from keras_ipu.device.compiler import tensor_parallel_partitioner as partitioner

    calls = []
    ask = partitioner.Partitioner._ask
    monkeypatch.setattr(partitioner.Partitioner, "_ask",
                        lambda self, value, want: calls.append(1) or ask(self, value, want))

    def chain(w, x):
        for _ in range(12):
            x = x * x
        return w * x

    rng = np.random.default_rng(5)
    w, x = (rng.normal(size=(4, 8)).astype(np.float32) for _ in range(2))
    options = CompileOptions(tensor_parallel=TensorParallel.of(2, {0: 1}),
                             fuse_elementwise=False)
    part = jit(chain, options=options).executable(w, x).tensor_parallel.partitioned
    assert part.inferred == (1,)  # x is only ever read split: split too
    assert part.collectives == []
    assert len(calls) < 100, len(calls)


def test_a_chain_of_loop_carries_settles_split():
    # Ten carries, each updated from the one before: the split of w reaches
    # the last after ten trial partitions of the body; all stay split, and
    # nothing crosses the links in the loop.
    n = 10

    def program(w, x):
        def body(i, carries):
            return i + 1, (carries[0],) + tuple(c * 2.0 for c in carries[:-1])

        _, carries = keras.ops.while_loop(
            lambda i, carries: i < 3, body, (0, (w,) + (keras.ops.zeros_like(w),) * n))
        return x @ carries[-1]

    args = _args()
    part = _split_as_whole(program, {0: 1}, args[0], args[2])
    assert part.collectives == []
    assert part.output_shardings == (1,)


def test_an_elementwise_op_keeps_the_split_that_gathers_fewer_bytes():
    # v [64] split on its 64 entries plus m [64, 64] split on its rows: v
    # lines up with m's columns. Keeping v's split would gather m (16,384 B);
    # keeping m's gathers v (256 B).
    def add(v, m):
        return v + m

    rng = np.random.default_rng(6)
    v, m = rng.normal(size=(64,)).astype(np.float32), rng.normal(size=(64, 64)).astype(np.float32)
    part = _split_as_whole(add, {0: 0, 1: 0}, v, m)
    assert [(c.kind, c.nbytes) for c in part.collectives] == [("all-gather", 256)]
    assert part.output_shardings == (0,)


def test_a_cond_lists_the_collectives_of_the_branch_that_sends_most():
    # One branch sorts h (no split form: h [64, 64] all-gathered, 16,384 B),
    # the other sums it over its split columns (partial sums, an all-reduce
    # of [64], 256 B). A run takes one branch: the listing keeps the larger.
    def program(w, x):
        h = x @ w
        return keras.ops.cond(keras.ops.sum(x) > 0,
                              lambda: keras.ops.sort(h, axis=-1)[:, 0],
                              lambda: keras.ops.sum(h, axis=1))

    args = _args()
    part = _split_as_whole(program, {0: 1}, args[0], args[2])
    assert [(c.kind, c.nbytes) for c in part.collectives] == [("all-gather", 16384)]
    branches = [n for n in part.local.nodes if n.primitive.name == "cond"][0].params["branches"]
    kinds = sorted(n.primitive.name for b in branches for n in b.nodes
                   if n.primitive.name.startswith("cross_replica"))
    assert kinds == ["cross_replica_all_gather", "cross_replica_sum"]  # both still run

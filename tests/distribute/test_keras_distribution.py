"""keras.distribution on the ipu backend: devices are IPUs, DataParallel is
IPU replication (the same numbers as IPUStrategy's), layouts that split a
weight across IPUs are tensor parallelism (compiler/tensor_parallel.py)."""

import keras
import numpy as np
import pytest
from keras.src.backend import distribution_lib as keras_backend_dlib
from keras.distribution import DataParallel
from keras.distribution import DeviceMesh
from keras.distribution import LayoutMap
from keras.distribution import ModelParallel
from keras.distribution import TensorLayout

import keras_ipu as ipu
from keras_ipu.backend import distribution_lib
from keras_ipu.models.extension import KerasExtension

from ipu_keras_helpers import configure


def make_model():
    keras.utils.set_random_seed(7)
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(5, activation="tanh"),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"],
                  steps_per_execution=2)
    return model


def data(n=32):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(n, 4)).astype("float32"),
            rng.normal(size=(n, 1)).astype("float32"))


def replicated_reference(x, y, epochs):
    """The model trained in an IPUStrategy on 2 replicas of 4 samples each:
    what DataParallel's global batch of 8 must reproduce."""
    configure(2)
    with ipu.ipu_strategy.IPUStrategy().scope():
        model = make_model()
    model.fit(x, y, batch_size=4, epochs=epochs, shuffle=False, verbose=0)
    return model


def test_keras_sees_the_ipu_backends_distribution_lib():
    assert keras_backend_dlib is distribution_lib


def test_devices_are_the_ipus_of_the_device_models_run_on():
    assert keras.distribution.list_devices() == ["ipu:0"]  # the default system
    configure(4)
    assert keras.distribution.list_devices() == ["ipu:0", "ipu:1", "ipu:2", "ipu:3"]
    assert keras.distribution.list_devices("IPU") == keras.distribution.list_devices()
    assert keras.distribution.get_device_count() == 4
    assert keras.distribution.list_devices("cpu") == ["cpu:0"]
    with pytest.raises(ValueError, match=r"device_type='gpu'.*'ipu'.*'cpu'"):
        keras.distribution.list_devices("gpu")


def test_data_parallel_trains_as_ipu_strategy_replication():
    x, y = data()
    # An IPUStrategy batch is one replica's: 4 per replica, 8 per step.
    replicated = replicated_reference(x, y, epochs=2)

    keras.distribution.set_distribution(DataParallel())
    model = make_model()
    assert isinstance(model, KerasExtension)
    assert model._get_replication_factor() == 2
    # Keras' batch is global: 8 split over the 2 replicas.
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for ours, theirs in zip(model.get_weights(), replicated.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    assert len(history.history["loss"]) == 2
    # The replicas' shares make one global batch's gradient: one device with
    # the whole batch takes the same steps, up to float32 rounding.
    keras.distribution.set_distribution(None)
    single = make_model()
    assert not isinstance(single, KerasExtension)
    single.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for ours, theirs in zip(model.get_weights(), single.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_data_parallel_splits_a_tf_dataset_and_predicts_in_order():
    import tensorflow as tf

    x, y = data()
    replicated = replicated_reference(x, y, epochs=1)

    with DataParallel().scope():
        model = make_model()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
    model.fit(dataset, epochs=1, verbose=0)
    for ours, theirs in zip(model.get_weights(), replicated.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    expected = x @ model.get_weights()[0] + model.get_weights()[1]
    expected = np.tanh(expected) @ model.get_weights()[2] + model.get_weights()[3]
    np.testing.assert_allclose(model.predict(x, batch_size=8, verbose=0), expected,
                               rtol=1e-5, atol=1e-6)


def test_metrics_are_the_global_batchs():
    configure(2)
    x, y = data()
    y[:16] += 10.0  # the replicas see different data: their metrics differ
    single = make_model()
    expected = single.evaluate(x, y, batch_size=16, verbose=0)
    keras.distribution.set_distribution(DataParallel())
    model = make_model()
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=16, verbose=0), expected,
                               rtol=1e-5)


def test_global_batch_must_split_evenly_over_the_replicas():
    configure(2)
    x, y = data()
    keras.distribution.set_distribution(DataParallel())
    model = make_model()
    with pytest.raises(ValueError, match="global batch_size 7 cannot be split over 2 replicas"):
        model.fit(x, y, batch_size=7, verbose=0)


def test_a_mesh_over_part_of_the_device_is_refused_at_fit():
    configure(4)
    x, y = data()
    keras.distribution.set_distribution(DataParallel(devices=["ipu:0", "ipu:1"]))
    model = make_model()
    with pytest.raises(ValueError, match=r"2 model replicas, but the model runs 4 replica"):
        model.fit(x, y, batch_size=8, verbose=0)


def test_unknown_devices_are_refused():
    configure(2)
    with pytest.raises(ValueError, match=r"'ipu:5' is not in the configured system"):
        DataParallel(devices=["ipu:0", "ipu:5"]).device_mesh.backend_mesh
    with pytest.raises(ValueError, match=r"'gpu:0' is not a device of the ipu backend"):
        DeviceMesh((1,), ["batch"], ["gpu:0"]).backend_mesh


def test_model_parallel_over_one_ipu_per_replica_is_data_parallel():
    configure(2)
    mesh = DeviceMesh((2, 1), ["batch", "model"], keras.distribution.list_devices())
    layout_map = LayoutMap(mesh)
    layout_map[".*dense.*kernel"] = (None, "model")
    keras.distribution.set_distribution(ModelParallel(layout_map=layout_map))
    x, y = data()
    model = make_model()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert model._get_replication_factor() == 2


def mlp(hidden=64):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((32,)),
        keras.layers.Dense(hidden, activation="relu", name="dense_1"),
        keras.layers.Dense(16, name="dense_2"),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse",
                  steps_per_execution=2)
    return model


def mlp_data(n=32):
    rng = np.random.default_rng(5)
    return (rng.normal(size=(n, 32)).astype("float32"),
            rng.normal(size=(n, 16)).astype("float32"))


def megatron(mesh_shape):
    """Megatron's MLP layouts: dense_1 column-parallel, dense_2 row-parallel."""
    configure(int(np.prod(mesh_shape)))
    mesh = DeviceMesh(mesh_shape, ["batch", "model"], keras.distribution.list_devices())
    layout_map = LayoutMap(mesh)
    # Keras matches the whole path (sequential/dense_1/kernel) to a key.
    layout_map[".*dense_1/kernel"] = (None, "model")
    layout_map[".*dense_1/bias"] = ("model",)
    layout_map[".*dense_2/kernel"] = ("model", None)
    keras.distribution.set_distribution(ModelParallel(layout_map=layout_map))


def fit_program(model):
    [exe] = model.train_function.execution.device_loop.executables()
    return exe


@pytest.mark.parametrize("k", [2, 4])
def test_model_parallel_splits_the_weights_over_the_model_axis(k):
    x, y = mlp_data()
    whole = mlp()
    whole.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)

    megatron((1, k))
    model = mlp()
    assert model._get_replication_factor() == 1  # one replica on k IPUs
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    # The values are computed whole: bit-identical to the unsplit run.
    for ours, theirs in zip(model.get_weights(), whole.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(model.predict(x, batch_size=8, verbose=0),
                                  whole.predict(x, batch_size=8, verbose=0))
    [predict_program] = model.predict_function.execution.device_loop.executables()
    assert predict_program.tensor_parallel.ipus == k

    exe = fit_program(model)
    part = exe.tensor_parallel.partitioned
    assert part.tp.ipus == k and part.tp.axis == "model"
    paths = {j: p.split("/", 1)[-1] for j, p in part.tp.names}  # without the model's name
    split = {paths[j]: s for j, s in enumerate(part.input_shardings) if s is not None
             and j in paths}
    # The kernels and dense_1's bias as laid out; the momentum of each (no
    # layout given: its update adds the split gradient) split the same way.
    assert split["dense_1/kernel"] == 1 and split["dense_2/kernel"] == 0
    assert split["dense_1/bias"] == 0
    momenta = [p for p in split if "momentum" in p]
    assert len(momenta) == 3, split
    # dense_1/kernel 32 x 64 x 4 B = 8,192 B, 1/k per IPU; its momentum too.
    held = part.sharded_input_bytes(exe.graph)
    names = {v: j for j, v in paths.items()}
    assert held[names["dense_1/kernel"]] == (8192, 8192 // k)
    assert held[names["dense_2/kernel"]] == (4096, 4096 // k)
    # One all-reduce per step: the row-parallel layer's [8, 16] float32
    # output (512 B), twice per run (steps_per_execution=2).
    assert [(c.kind, c.nbytes, c.count) for c in part.collectives] == [("all-reduce", 512, 2)]
    assert sorted(exe.memory_by_ipu) == list(range(k))
    assert exe.prediction.ipu_cycles == {i: exe.prediction.cycles for i in range(k)}


def test_model_parallel_with_replicas_on_a_two_by_two_mesh():
    x, y = mlp_data()
    megatron((2, 1))
    reference = mlp()
    reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    keras.distribution.set_distribution(None)

    megatron((2, 2))
    model = mlp()
    assert model._get_replication_factor() == 2  # 2 replicas of 2 IPUs each
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for ours, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    part = fit_program(model).tensor_parallel.partitioned
    # Each replica's 4 samples: the row-parallel all-reduce is [4, 16] float32.
    assert [(c.kind, c.nbytes) for c in part.collectives] == [("all-reduce", 256)]


def test_a_split_that_does_not_divide_the_dimension_names_the_variable():
    megatron((1, 4))
    model = mlp(hidden=6)
    x, y = mlp_data()
    with pytest.raises(ValueError, match=r"dense_1/kernel f32\[32,6\] splits dimension 1 "
                       r"\(size 6\) over the 4 IPUs of the mesh axis 'model'.*not a multiple"
                       r" of 4.*mesh axis whose size divides 6"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)


def test_splits_keras_ipu_does_not_do_are_not_implemented():
    configure(4)
    mesh = DeviceMesh((2, 2), ["batch", "model"], keras.distribution.list_devices())
    layout_map = LayoutMap(mesh)
    layout_map[".*dense.*kernel"] = ("batch", "model")
    keras.distribution.set_distribution(ModelParallel(layout_map=layout_map))
    x, y = data()
    with pytest.raises(NotImplementedError, match="splits dimension 0 over 'batch'.*one mesh axis"):
        make_model().fit(x, y, batch_size=8, verbose=0)
    three = DeviceMesh((1, 2, 2), ["batch", "model", "expert"],
                       keras.distribution.list_devices())
    keras.distribution.set_distribution(ModelParallel(layout_map=LayoutMap(three)))
    with pytest.raises(NotImplementedError, match=r"over the axes \{'model': 2, 'expert': 2\}"):
        make_model()


def test_a_mesh_whose_replicas_are_not_consecutive_ipus_is_refused():
    configure(4)
    devices = np.array(keras.distribution.list_devices()).reshape(2, 2).T
    mesh = DeviceMesh((2, 2), ["batch", "model"], devices)
    keras.distribution.set_distribution(ModelParallel(layout_map=LayoutMap(mesh)))
    with pytest.raises(ValueError, match=r"replica r of the 'batch' axis runs on the "
                       r"consecutive IPUs"):
        make_model()


def test_distribute_tensor_keeps_values_of_batch_and_replicated_layouts():
    configure(2)
    distribution = DataParallel()
    keras.distribution.set_distribution(distribution)
    x = np.arange(8.0).reshape(4, 2)
    layout = distribution.get_data_layout(x.shape)
    assert distribution_lib.distribute_data_input(x, layout, "batch") is x
    assert keras.distribution.distribute_tensor(x, layout) is x
    assert distribution_lib.distribute_variable(x, TensorLayout((None, None), distribution.device_mesh)) is x


def test_processes_are_the_mpi_launchers(monkeypatch):
    assert (distribution_lib.num_processes(), distribution_lib.process_id()) == (1, 0)
    monkeypatch.setenv("PMI_SIZE", "4")
    monkeypatch.setenv("PMI_RANK", "2")
    assert (distribution_lib.num_processes(), distribution_lib.process_id()) == (4, 2)
    keras.distribution.initialize(num_processes=4, process_id=2)  # agrees: nothing to do
    with pytest.raises(ValueError, match=r"num_processes=2\) but this process was launched as one of 4"):
        keras.distribution.initialize(num_processes=2)
    with pytest.raises(ValueError, match=r"process_id=1\) but this process has MPI rank 2"):
        keras.distribution.initialize(num_processes=4, process_id=1)
    assert DataParallel(devices=["ipu:0"]).num_processes == 4


def test_a_transformer_block_with_megatrons_layouts_needs_megatrons_all_reduces():
    # Attention heads and the first FFN layer column-parallel, the attention
    # output and the second FFN layer row-parallel (Megatron-LM): per step,
    # forward one all-reduce after each row-parallel layer; backward one for
    # the input gradient of each column-parallel layer (query, key, value,
    # ff1). Nothing else crosses the links; the values are the unsplit run's.
    def block():
        keras.utils.set_random_seed(2)
        tokens = keras.Input((8,), dtype="int32")
        h = keras.layers.Embedding(50, 32, name="emb")(tokens)
        h = keras.layers.LayerNormalization(name="ln")(
            h + keras.layers.MultiHeadAttention(4, 8, name="mha")(h, h))
        f = keras.layers.Dense(64, activation="gelu", name="ff1")(h)
        h = h + keras.layers.Dense(32, name="ff2")(f)
        out = keras.layers.Dense(5, name="head")(keras.layers.GlobalAveragePooling1D()(h))
        model = keras.Model(tokens, out)
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, size=(16, 8)).astype("int32")
    y = rng.integers(0, 5, size=(16,))
    whole = block()
    whole.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)

    configure(2)
    mesh = DeviceMesh((1, 2), ["batch", "model"], keras.distribution.list_devices())
    layout_map = LayoutMap(mesh)
    for name in ("query", "key", "value"):
        layout_map[f".*mha/{name}/kernel"] = (None, "model", None)
    layout_map[".*mha/attention_output/kernel"] = ("model", None, None)
    layout_map[".*ff1/kernel"] = (None, "model")
    layout_map[".*ff2/kernel"] = ("model", None)
    with ModelParallel(layout_map=layout_map).scope():
        model = block()
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    for ours, theirs in zip(model.get_weights(), whole.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    part = fit_program(model).tensor_parallel.partitioned
    # [8, 8, 32] float32 activations: 8,192 B each.
    assert sorted((c.kind, c.source, c.nbytes) for c in part.collectives) == sorted(
        ("all-reduce", source, 8192)
        for source in ("mha/attention_output", "ff2", "ff1", "mha/query", "mha/key",
                       "mha/value"))

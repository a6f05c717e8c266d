"""IPUEstimator with num_shards > 1 (the model_fn sharded with
scopes.ipu_shard), replicated estimators (CrossReplicaOptimizer, each
replica its own batches of the input_fn's dataset) and the replicated
IPUPipelineEstimator (issue 12, item 1); the device-size checks Graphcore
makes of them."""

import contextlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras_ipu as ipu  # noqa: E402
from keras_ipu import ipu_estimator  # noqa: E402
from keras_ipu import ipu_pipeline_estimator  # noqa: E402
from keras_ipu import ipu_run_config  # noqa: E402
from keras_ipu.device.ir import subgraphs  # noqa: E402
from keras_ipu.ops import pipelining_ops  # noqa: E402

RNG = np.random.default_rng(3)
X = RNG.random((64, 4)).astype("float32")
Y = X @ np.array([[1.0], [-2.0], [3.0], [0.5]], "float32")
LR, IPL = 0.05, 4


def input_fn(params):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(
        params["batch_size"], drop_remainder=True).repeat()


def run_config(model_dir, replicas=1, shards=1):
    options = ipu.config.IPUConfig()
    options.auto_select_ipus = replicas * shards
    return ipu_run_config.RunConfig(
        ipu_run_config=ipu_run_config.IPURunConfig(
            iterations_per_loop=IPL, num_replicas=replicas, num_shards=shards,
            ipu_options=options),
        model_dir=str(model_dir), save_checkpoints_steps=IPL)


def _optimizer(params):
    opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
    if params["replicas"] > 1:
        opt = ipu.optimizers.CrossReplicaOptimizer(opt)
    if params["shards"] > 1:
        opt = ipu.optimizers.ShardedOptimizer(opt)
    return opt


def model_fn(features, labels, mode, params):
    """Two dense layers; with params["shards"] = 2 the first on shard 0, the
    second and the loss on shard 1."""
    shard = (ipu.scopes.ipu_shard if params["shards"] > 1
             else lambda _: contextlib.nullcontext())
    with shard(0):
        w = tf.compat.v1.get_variable("w", shape=(4, 8),
                                      initializer=tf.compat.v1.constant_initializer(0.1))
        h = tf.tanh(tf.matmul(features, w))
    with shard(1):
        v = tf.compat.v1.get_variable("v", shape=(8, 1),
                                      initializer=tf.compat.v1.constant_initializer(0.2))
        loss = tf.reduce_mean(tf.square(tf.matmul(h, v) - labels))
    return ipu_estimator.IPUEstimatorSpec(mode, loss=loss,
                                          train_op=_optimizer(params).minimize(loss))


def estimator(model_dir, batch, replicas=1, shards=1):
    return ipu_estimator.IPUEstimator(
        model_fn, config=run_config(model_dir, replicas, shards),
        params={"replicas": replicas, "shards": shards}, train_batch_size=batch * replicas)


def reference(steps, batch):
    """NumPy gradient descent of model_fn on consecutive batches."""
    w, v = np.full((4, 8), 0.1, np.float32), np.full((8, 1), 0.2, np.float32)
    for t in range(steps):
        k = (t * batch) % len(X)
        x, y = X[k:k + batch], Y[k:k + batch]
        h = np.tanh(x @ w)
        d = (2.0 / batch) * (h @ v - y)
        gv, gw = h.T @ d, x.T @ ((d @ v.T) * (1 - h ** 2))
        w, v = w - LR * gw, v - LR * gv
    return w, v


def _nodes(graph):
    for node in graph.nodes:
        yield node
        for sub in subgraphs(node):
            yield from _nodes(sub)


@pytest.fixture
def programs(monkeypatch):
    """The loop programs the estimators make, in order."""
    made = []
    original = ipu_estimator.IPUEstimator._program

    def keep(self, mode, input_fn):
        made.append(original(self, mode, input_fn))
        return made[-1]

    monkeypatch.setattr(ipu_estimator.IPUEstimator, "_program", keep)
    return made


def test_a_sharded_estimator_runs_each_shard_on_its_ipu(tmp_path, programs):
    sharded = estimator(tmp_path / "sharded", 8, shards=2)
    sharded.train(input_fn, steps=8)
    w, v = reference(8, 8)
    np.testing.assert_allclose(sharded.get_variable_value("w"), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sharded.get_variable_value("v"), v, rtol=1e-5, atol=1e-6)

    (exe,) = programs[-1]._bridged.executables()
    assert exe.ipus == (0, 1)
    products = {n.source: n.ipu for n in _nodes(exe.graph) if n.primitive.name == "dot_general"}
    # Forward and backward of each layer on its shard (ShardedOptimizer
    # gives a gradient op its forward op's shard): w's on IPU 0, v's on 1.
    assert products == {
        "while/MatMul": 0, "while/gradients/while/MatMul_grad/MatMul_1": 0,
        "while/MatMul_1": 1, "while/gradients/while/MatMul_1_grad/MatMul": 1,
        "while/gradients/while/MatMul_1_grad/MatMul_1": 1,
        "while/gradients/while/MatMul_grad/MatMul": 0}
    copies = [n for n in _nodes(exe.graph) if n.primitive.name == "ipu_copy"]
    assert {(n.params["src"], n.params["dst"]) for n in copies} == {(0, 1), (1, 0)}


def test_a_replicated_estimator_equals_one_replica_on_the_doubled_batch_and_resumes(tmp_path):
    single = estimator(tmp_path / "single", 16)
    single.train(input_fn, steps=8)
    replicated = estimator(tmp_path / "replicated", 8, replicas=2)
    replicated.train(input_fn, steps=4)
    # A new estimator on the directory resumes at step 4 (the checkpoint).
    resumed = estimator(tmp_path / "replicated", 8, replicas=2)
    assert resumed.get_variable_value("global_step") == 4
    resumed.train(input_fn, steps=4)
    assert resumed.get_variable_value("global_step") == 8
    for name in ("w", "v"):
        np.testing.assert_allclose(resumed.get_variable_value(name),
                                   single.get_variable_value(name), rtol=1e-5, atol=1e-6)


def test_a_sharded_and_replicated_estimator_uses_four_ipus(tmp_path, programs):
    both = estimator(tmp_path, 4, replicas=2, shards=2)
    both.train(input_fn, steps=4)
    w, v = reference(4, 8)  # replica r of step t reads batch 2t + r
    np.testing.assert_allclose(both.get_variable_value("v"), v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(both.get_variable_value("w"), w, rtol=1e-5, atol=1e-6)
    assert programs[-1]._bridged.executables()[0].ipus == (0, 1)  # per replica


def test_the_run_config_must_select_replicas_times_shards_ipus(tmp_path):
    with pytest.raises(ValueError,
                       match="requires more than one device, but `ipu_options` is None"):
        ipu_run_config.IPURunConfig(num_shards=2)
    options = ipu.config.IPUConfig()
    options.auto_select_ipus = 2
    with pytest.raises(ValueError, match=r"configured with 4 devices \(2 replicas times 2 "
                                         r"shards\), but `ipu_options` configured with 2"):
        ipu_run_config.IPURunConfig(num_replicas=2, num_shards=2, ipu_options=options)
    with pytest.raises(ValueError, match="Only 1 device"):
        ipu_run_config.IPURunConfig(num_shards=2, ipu_options=options, ordinal=1)


def test_a_program_with_more_shards_than_the_device_has_ipus_is_refused(configure_ipus):
    """Graphcore's compiler: the shards (the highest shard + 1 rounded up to
    a power of two: 3 -> 4) must divide the device's IPUs."""
    configure_ipus(2)

    def sharded(x):
        with ipu.scopes.ipu_shard(0):
            y = x * 2.0
        with ipu.scopes.ipu_shard(2):
            return y + 1.0

    with pytest.raises(ValueError, match="Trying to compile a graph for an IPU device with 2 "
                                         "IPUs and 4 shards. The number of shards needs to "
                                         "divide the number of IPUs."):
        ipu.ipu_compiler.compile(sharded, inputs=[tf.ones((2,))])

    def pipelined(x):
        def stage(x):
            return x * x

        return pipelining_ops.pipeline(
            [stage, stage, stage], gradient_accumulation_count=3, inputs=[x],
            outfeed_queue=ipu.ipu_outfeed_queue.IPUOutfeedQueue(),
            pipeline_schedule=pipelining_ops.PipelineSchedule.Sequential)

    with pytest.raises(ValueError, match="with 2 IPUs and 4 shards"):
        ipu.ipu_compiler.compile(pipelined, inputs=[tf.ones((2,))])


# -- the replicated pipeline estimator ------------------------------------

GAC = 4


def stage1(x, y):
    w = tf.compat.v1.get_variable("w", shape=(4, 8),
                                  initializer=tf.compat.v1.constant_initializer(0.1))
    return tf.tanh(tf.matmul(x, w)), y


def stage2(h, y):
    v = tf.compat.v1.get_variable("v", shape=(8, 1),
                                  initializer=tf.compat.v1.constant_initializer(0.2))
    pred = tf.matmul(h, v)
    return tf.reduce_mean(tf.square(pred - y)), pred, y


def pipeline_model_fn(mode, params):
    def optimizer_function(loss, pred, y):
        return pipelining_ops.OptimizerFunctionOutput(_optimizer(dict(params, shards=1)), loss)

    def eval_metrics_fn(loss, pred, y):
        return {"loss": loss, "mse": tf.compat.v1.metrics.mean_squared_error(y, pred)}

    return ipu_pipeline_estimator.IPUPipelineEstimatorSpec(
        mode, computational_stages=[stage1, stage2], gradient_accumulation_count=GAC,
        optimizer_function=optimizer_function, eval_metrics_fn=eval_metrics_fn)


def pipeline_estimator(model_dir, batch, replicas=1):
    return ipu_pipeline_estimator.IPUPipelineEstimator(
        pipeline_model_fn, config=run_config(model_dir, replicas, shards=2),
        params={"replicas": replicas, "batch_size": batch})


def test_a_replicated_pipeline_estimator_equals_one_replica_on_the_doubled_batch(tmp_path,
                                                                                 programs):
    single = pipeline_estimator(tmp_path / "single", 8)
    for _ in range(2):  # each train() reads input_fn's dataset from its start
        single.train(input_fn, steps=4)
    replicated = pipeline_estimator(tmp_path / "replicated", 4, replicas=2)
    replicated.train(input_fn, steps=4)
    resumed = pipeline_estimator(tmp_path / "replicated", 4, replicas=2)
    resumed.train(input_fn, steps=4)  # from the step-4 checkpoint
    assert resumed.get_variable_value("global_step") == 8
    for name in ("w", "v"):
        np.testing.assert_allclose(resumed.get_variable_value(name),
                                   single.get_variable_value(name), rtol=1e-5, atol=1e-6)
    assert programs[-1]._bridged.executables()[0].ipus == (0, 1)  # each replica's two IPUs
    # Evaluation: the metrics over every replica's micro-batches.
    one, two = single.evaluate(input_fn, steps=IPL), resumed.evaluate(input_fn, steps=IPL)
    np.testing.assert_allclose(two["mse"], one["mse"], rtol=1e-5)
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)

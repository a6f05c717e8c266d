"""tf.keras code through the TensorFlow front end, run as a script under
KERAS_BACKEND=tensorflow (the test session itself runs the ipu backend):

    KERAS_BACKEND=tensorflow python keras_tf_scenarios.py NAME [NAME ...]

prints one JSON object {name: result} on its last line. Used by
test_keras_tensorflow.py.
"""

import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The Keras API tests' shared models (ipu_keras_helpers), backend-neutral.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "keras_api"))


def _conv_net(keras, dropout):
    layers = [
        keras.Input((12, 12, 3)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(8, 3, padding="same", strides=2),
        keras.layers.Flatten(),
    ]
    if dropout:
        layers.append(keras.layers.Dropout(0.2))
    layers.append(keras.layers.Dense(10))
    return keras.Sequential(layers)


def _loss_curve(mode, dropout, steps=20):
    """Training losses of a conv net: `mode` "xla" (TensorFlow compiles the
    step with XLA), "tf" (TensorFlow without XLA) or "ipu" (the bridge)."""
    import keras
    import tensorflow as tf

    from keras_ipu.frontends.tensorflow.function import bridge

    keras.utils.set_random_seed(7)
    model = _conv_net(keras, dropout)
    opt = keras.optimizers.Adam(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    fn = tf.function(step, jit_compile=(mode != "tf"))
    if mode == "ipu":
        fn = bridge(fn)
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(steps, 8, 12, 12, 3)).astype(np.float32)
    ys = rng.integers(0, 10, size=(steps, 8)).astype(np.int32)
    return [float(fn(xs[i], ys[i])) for i in range(steps)]


def conv_net_losses():
    out = {}
    out["ipu_dropout"] = _loss_curve("ipu", True)
    out["xla_dropout"] = _loss_curve("xla", True)
    out["ipu"] = _loss_curve("ipu", False)
    out["tf"] = _loss_curve("tf", False)
    return out


def graphcore_custom_loop():
    """Graphcore's TF2 infeed/outfeed tutorial (mnist_with_feeds.py), with
    small synthetic data, after the porting contract's edits (none for
    TensorFlow code)."""
    import tensorflow as tf
    from tensorflow import keras
    from tensorflow.python.ipu import ipu_outfeed_queue
    from tensorflow.python.ipu import ipu_strategy

    from keras_ipu.frontends.tensorflow.function import bridge

    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 255, size=(256, 28, 28)).astype(np.float32) / 255.0
    y_train = rng.integers(0, 10, size=256)
    ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32, drop_remainder=True)
    ds = ds.map(lambda d, l: (tf.cast(d, tf.float32), tf.cast(l, tf.int32))).repeat()

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    opt = keras.optimizers.SGD(0.01)

    @tf.function(jit_compile=True)
    def training_loop(iterator, outfeed_queue, model, optimizer, steps_per_execution):
        for _ in tf.range(steps_per_execution):
            features, labels = next(iterator)
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, predictions))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            outfeed_queue.enqueue(loss)

    strategy = ipu_strategy.IPUStrategy()
    with strategy.scope():
        iterator = iter(ds)
        outfeed_queue = ipu_outfeed_queue.IPUOutfeedQueue()
        for _ in range(0, 30, 10):
            strategy.run(training_loop, args=[iterator, outfeed_queue, model, opt, 10])
        losses = outfeed_queue.dequeue().numpy()

    # The same 30 steps by TensorFlow, from the same weights and data.
    keras.utils.set_random_seed(1)
    ref = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
                            keras.layers.Dense(10, activation="softmax")])
    ref_opt = keras.optimizers.SGD(0.01)

    @tf.function
    def ref_step(features, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                labels, ref(features, training=True)))
        grads = tape.gradient(loss, ref.trainable_variables)
        ref_opt.apply_gradients(zip(grads, ref.trainable_variables))
        return loss

    ref_losses = [float(ref_step(f, l)) for f, l in ds.take(30)]
    return {"losses": losses.tolist(), "reference": ref_losses,
            "iterations": int(opt.iterations.numpy()),
            "programs": bridge(training_loop).compile_count,
            "input_bytes": _bytes_by_category(bridge(training_loop)),
            "expected_bytes": {"weights": _variable_bytes(model.weights),
                               "optimizer state": _variable_bytes(opt.variables)}}


def _mlp(keras, steps_per_execution, metrics=("accuracy",), batch_norm=True):
    keras.utils.set_random_seed(2)
    layers = [keras.Input((10,)), keras.layers.Dense(16, activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    model = keras.Sequential(layers + [keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=list(metrics), steps_per_execution=steps_per_execution)
    return model


def _xy(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 10)).astype(np.float32)
    return x, (x.sum(1) > 0).astype(np.int32)


def _bytes_by_category(bridged):
    """{category: bytes} of the inputs of `bridged`'s one executable, as its
    profile report counts them."""
    from keras_ipu.device.simulator import profile

    (exe,) = bridged.executables()
    out = {}
    for v, category in zip(exe.graph.inputs, profile.input_categories(exe)):
        out[category] = out.get(category, 0) + (v.aval.nbytes or 0)
    return out


def _variable_bytes(variables):
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)


def _max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b))


def keras_fit_evaluate_predict():
    """fit/evaluate/predict of a model made in an IPUStrategy scope: the
    numbers of TensorFlow's own fit, steps_per_execution steps per program
    (one program compiled per kind, each run once per execution)."""
    import keras
    from tensorflow.python.ipu import ipu_strategy

    x, y = _xy()
    strategy = ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = _mlp(keras, 4)
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
        evaluated = model.evaluate(x, y, batch_size=8, verbose=0)
        predicted = model.predict(x[:44], batch_size=8, verbose=0)
    ref = _mlp(keras, 1)
    ref_history = ref.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    return {
        "on_ipu": getattr(model, "_ipu_tf_strategy", None) is strategy,
        "loss": history.history["loss"], "ref_loss": ref_history.history["loss"],
        "accuracy": history.history["accuracy"], "ref_accuracy": ref_history.history["accuracy"],
        "evaluate": evaluated, "ref_evaluate": ref.evaluate(x, y, batch_size=8, verbose=0),
        "predict_shape": list(predicted.shape),
        "predict_diff": float(np.max(np.abs(predicted - ref.predict(x[:44], batch_size=8, verbose=0)))),
        "weights_diff": _max_diff(model.weights, ref.weights),
        "iterations": int(model.optimizer.iterations.numpy()),
        "train_programs": model.train_function.execution.runs,
        "compiled": sum(p.compile_count for p in model.train_function.execution.programs()),
        "input_bytes": _bytes_by_category(model.train_function.execution.programs()[0]),
        "expected_bytes": {"weights": _variable_bytes(model.weights),
                           "optimizer state": _variable_bytes(model.optimizer.variables),
                           "metric state": _variable_bytes(model.metrics_variables)},
    }


def keras_gradient_accumulation():
    """set_gradient_accumulation_options(2): the gradients of two batches
    summed (Graphcore's default reduction), one update per two batches."""
    import keras
    import tensorflow as tf
    from tensorflow.python.ipu import ipu_strategy

    x, y = _xy()
    strategy = ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = _mlp(keras, 4, metrics=())
        model.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=2)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        bad = _mlp(keras, 3, metrics=())
        bad.set_gradient_accumulation_options(gradient_accumulation_steps_per_replica=2)
        try:
            bad.fit(x, y, batch_size=8, epochs=1, verbose=0)
            error = None
        except RuntimeError as e:
            error = f"{type(e).__name__}: {e}"
    ref = _mlp(keras, 1, metrics=())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for i in range(0, 64, 16):
        grads = None
        for j in (i, i + 8):
            with tf.GradientTape() as tape:
                loss = loss_fn(y[j:j + 8], ref(x[j:j + 8], training=True))
            g = tape.gradient(loss, ref.trainable_variables)
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        ref.optimizer.apply_gradients(zip(grads, ref.trainable_variables))
    return {"weights_diff": _max_diff(model.weights, ref.weights),
            "iterations": int(model.optimizer.iterations.numpy()), "error": error}


def keras_replication():
    """Two replicas: each takes every other batch, the gradients are
    averaged across them before the update (the mean of two batches'
    gradients); predictions come back in batch order."""
    import keras
    import tensorflow as tf
    from tensorflow.python import ipu

    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 2
    cfg.configure_ipu_system()
    x, y = _xy()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        # No BatchNormalization: each replica keeps its own moving statistics.
        model = _mlp(keras, 2, metrics=(), batch_norm=False)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        predicted = model.predict(x[:44], batch_size=8, verbose=0)
        replicas = strategy._replication_factor()
        runs = model.train_function.execution.runs
    ref = _mlp(keras, 1, metrics=(), batch_norm=False)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for i in range(0, 64, 16):
        grads = None
        for j in (i, i + 8):
            with tf.GradientTape() as tape:
                loss = loss_fn(y[j:j + 8], ref(x[j:j + 8], training=True))
            g = tape.gradient(loss, ref.trainable_variables)
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        ref.optimizer.apply_gradients(zip([g / 2 for g in grads], ref.trainable_variables))
    return {"replicas": replicas, "iterations": int(model.optimizer.iterations.numpy()),
            "train_programs": runs,
            "weights_diff": _max_diff(model.trainable_weights, ref.trainable_weights),
            "predict_diff": float(np.max(np.abs(predicted - ref.predict(x[:44], batch_size=8,
                                                                          verbose=0))))}


def keras_pipelined_replicas():
    """A two-stage pipelined model on four IPUs: two replicas of two IPUs
    (as Graphcore's and the ipu backend's), so an execution of
    steps_per_execution=2 takes 2 x 2 batches and makes one optimizer step
    (accumulation over 2): 8 batches, 2 executions, 2 updates."""
    import keras
    from tensorflow.python import ipu

    from keras_ipu.frontends.tensorflow import keras_trainer

    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 4
    cfg.configure_ipu_system()
    x, y = _xy()
    strategy = ipu.ipu_strategy.IPUStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(4),
                                  keras.layers.Dense(3)])
        model.set_pipeline_stage_assignment([0, 1])
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=2)
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=2)
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        return {"replicas": keras_trainer.replication_factor(model),
                "iterations": int(model.optimizer.iterations.numpy()),
                "train_programs": model.train_function.execution.runs}


def pipeline_stage_model(ipu):
    """The Keras API tests' two-stage PipelineStage model, in an IPUStrategy
    on 4 IPUs (two replicas of two IPUs), made through `ipu`; the same code
    runs under the ipu backend (test_keras_tensorflow.py)."""
    from ipu_keras_helpers import two_stage_pipeline

    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 4
    cfg.configure_ipu_system()
    model = two_stage_pipeline(ipu)
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(32, 16)).astype("float32"), rng.normal(size=(32, 8)).astype("float32"))
    return model, data


def _nodes(graph):
    from keras_ipu.device.ir import subgraphs

    for node in graph.nodes:
        yield node
        for sub in subgraphs(node):
            yield from _nodes(sub)


def placement_facts(exe, kernel_shapes):
    """What a placed program's placement should share across the two
    backends: its IPUs, the IPUs each kernel is multiplied on (a product
    with an operand of the kernel's shape), the directions of the copies
    between IPUs and the IPUs with predicted cycles."""
    kernels = {}
    for node in _nodes(exe.graph):
        if node.primitive.name == "dot_general":
            for v in node.inputs:
                shape = list(v.aval.shape)
                if shape in kernel_shapes:
                    kernels.setdefault(str(shape), set()).add(node.ipu)
    return {
        "ipus": list(exe.ipus),
        "kernels": {k: sorted(v) for k, v in sorted(kernels.items())},
        "copies": sorted({(n.params["src"], n.params["dst"]) for n in _nodes(exe.graph)
                          if n.primitive.name == "ipu_copy"}),
        "cycle_ipus": sorted(exe.prediction.ipu_cycles),
    }


def schedule_formula(pipeline):
    """The step cycles of a ShardedPrediction by its schedule's formula
    (sharding.py's module doc), from its per-IPU cycles."""
    ipus, g = pipeline.ipus, pipeline.gradient_accumulation_count
    n = len(ipus)
    if pipeline.schedule == "Sequential":
        return g * sum(p.cycles for p in ipus) + sum(p.weight_update_cycles for p in ipus)
    if pipeline.schedule == "Grouped":
        steady = max(p.cycles for p in ipus)
    else:
        steady = max(p.forward_cycles for p in ipus) + max(p.backward_cycles for p in ipus)
    return (g + n - 1) * steady + max(p.weight_update_cycles for p in ipus)


def keras_pipeline_stage_placed():
    """pipeline_stage_model trained, evaluated and predicted through the
    front end: its programs' placements and replicas."""
    from tensorflow.python import ipu

    from keras_ipu.frontends.tensorflow import keras_trainer

    model, (x, y) = pipeline_stage_model(ipu)
    history = model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False)
    model.evaluate(x, y, batch_size=2, verbose=0)
    model.predict(x, batch_size=2, verbose=0)
    shapes = [list(w.shape) for w in model.trainable_weights if len(w.shape) == 2]
    facts = {}
    for kind in ("train", "test", "predict"):
        (exe,) = getattr(model, f"{kind}_function").execution.executables()
        facts[kind] = json.loads(json.dumps(placement_facts(exe, shapes)))
    schedules = {}
    for kind in ("train", "test", "predict"):
        (exe,) = getattr(model, f"{kind}_function").execution.executables()
        pipe = exe.prediction.pipeline
        schedules[kind] = {
            "schedule": pipe.schedule, "micro_batches": pipe.gradient_accumulation_count,
            "training": pipe.training, "step_cycles": pipe.step_cycles,
            "formula": schedule_formula(pipe), "cycles": exe.prediction.cycles,
            "program_cycles": pipe.program_cycles, "in_flight": [p.in_flight for p in pipe.ipus],
            "forward": [p.forward_cycles for p in pipe.ipus],
            "backward": [p.backward_cycles for p in pipe.ipus],
            "after": [p.weight_update_cycles for p in pipe.ipus]}
    return {"replicas": keras_trainer.replication_factor(model),
            "iterations": int(model.optimizer.iterations.numpy()),
            "loss": history.history["loss"], "facts": facts, "schedule": schedules["train"],
            "inference": {k: schedules[k] for k in ("test", "predict")}}


def _loop_facts(exe):
    """The device loop of a training program as its prediction counts it:
    the while loop's trips (from the program), its body's cycles, the loop
    step's cycles; the run's cycles, the other steps' and the workload."""
    from keras_ipu.device.primitives.control_flow import while_p
    from keras_ipu.device.simulator import loop_trips
    from keras_ipu.device.simulator import prediction
    from keras_ipu.device.simulator.memory_model import graph_of

    pred = exe.prediction
    graph = graph_of(exe)
    (index,) = [i for i, n in enumerate(graph.nodes) if n.primitive is while_p]
    loop = graph.nodes[index]
    body = prediction.predict_graph(loop.params["body_graph"], pred.target)
    inner = [n for n in loop.params["body_graph"].nodes if n.primitive is while_p]
    return {"trips": loop_trips.trips(loop), "body_cycles": body.cycles,
            "inner_trips": [loop_trips.trips(n) for n in inner],
            "loop_cycles": pred.steps[index].cycles,
            "other_cycles": sum(s.cycles for i, s in enumerate(pred.steps) if i != index),
            "run_cycles": pred.cycles, "per_step": pred.cycles_per_step,
            "steps_per_run": pred.steps_per_run, "batch_size": pred.batch_size,
            "summary": pred.summary()}


def keras_run_and_step_cycles():
    """A tf.keras training program's prediction counts every step of an
    execution: steps_per_execution=4 is a device loop of 4 trips (read from
    the program), reported per run and per step; with accumulation over 2,
    a loop of 2 weight updates, each a loop over 2 micro-batches."""
    import keras
    from tensorflow.python import ipu

    cfg = ipu.config.IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    x, y = _xy()
    strategy = ipu.ipu_strategy.IPUStrategy()
    out = {}
    with strategy.scope():
        for name, count in (("plain", 1), ("accumulated", 2)):
            model = _mlp(keras, 4, metrics=())
            if count > 1:
                model.set_gradient_accumulation_options(
                    gradient_accumulation_steps_per_replica=count)
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
            (exe,) = model.train_function.execution.executables()
            out[name] = _loop_facts(exe)
    return out


SCENARIOS = {
    "keras_run_and_step_cycles": keras_run_and_step_cycles,
    "keras_pipeline_stage_placed": keras_pipeline_stage_placed,
    "keras_pipelined_replicas": keras_pipelined_replicas,
    "conv_net_losses": conv_net_losses,
    "graphcore_custom_loop": graphcore_custom_loop,
    "keras_fit_evaluate_predict": keras_fit_evaluate_predict,
    "keras_gradient_accumulation": keras_gradient_accumulation,
    "keras_replication": keras_replication,
}


if __name__ == "__main__":
    results = {name: SCENARIOS[name]() for name in sys.argv[1:]}
    print(json.dumps(results))

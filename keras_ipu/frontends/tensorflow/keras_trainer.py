"""tf.keras models (Keras 3 under KERAS_BACKEND=tensorflow) made in an
IPUStrategy scope: fit, evaluate and predict compiled through the
TensorFlow front end.

The import hook (keras_ipu/_hook.py) adds two things to Keras' TensorFlow
trainer: a model made in an IPUStrategy scope is attached to the strategy
(`on_model_created`: it gets the IPU extension methods, as under the ipu
backend), and such a model's make_train/test/predict_function come from
here. Each execution is one program on the simulated IPU, as Graphcore's
Keras runs it:

- the data arrives through an infeed (a host data stream read as the
  program consumes it) and the logs leave through an outfeed (the last
  step's, LAST mode; predictions: every step's, ALL mode);
- `steps_per_execution` steps run in an on-device loop (an XLA while);
- with gradient accumulation (`set_gradient_accumulation_options`), the
  gradients of `gradient_accumulation_steps_per_replica` batches are
  combined (SUM, MEAN, RUNNING_MEAN) and applied once, as on the ipu
  backend (models/training_step.py); steps_per_execution must be a
  multiple of it;
- on a device of several replicas (the strategy's replication factor)
  every replica runs the program on its own batches (batch i of an
  execution goes to replica i mod n), the gradients are all-reduced (mean
  over the replicas, XLA all-reduce -> cross_replica_sum) before the one
  weight update, and `steps_per_execution` counts one replica's steps, as
  in Graphcore's Keras: an execution takes replicas x steps_per_execution
  batches (the progress bar counts batches). Logs follow the model's
  replicated_metric_reduction_method (NONE: the last replica's); the
  variables keep replica 0's values (a BatchNormalization's moving
  statistics of the other replicas start from replica 0's at each
  execution).

The steps are Keras' own (train_step, test_step, predict_step of the
TensorFlow backend), so the numbers are TensorFlow's. When the data runs
out inside an execution, the steps that had data run again on the same
elements (the program's state is only written when it completes), so the
result equals TensorFlow's.
"""

import numpy as np

from keras_ipu.frontends.tensorflow.feeds import Infeed
from keras_ipu.frontends.tensorflow.feeds import Outfeed
from keras_ipu.frontends.tensorflow import replica_context
from keras_ipu.frontends.tensorflow.function import BridgedFunction
from keras_ipu.frontends.tensorflow.function import bridge
from keras_ipu.frontends.tensorflow.stages import pipeline_stage_of


def on_model_created(model):
    """Called by Keras' TensorFlowTrainer.__init__ (through the import
    hook): a model made in an IPUStrategy scope runs on that strategy's
    IPU and gets the extension methods."""
    from keras_ipu.distribute import scope

    strategy = scope.current_strategy()  # the IPUStrategy in scope, if any
    if strategy is None:
        return
    object.__setattr__(model, "_ipu_tf_strategy", strategy)
    patch = getattr(strategy, "_patch_keras_extension", None)
    if patch is not None:
        patch(model)
    for name in ("fit", "evaluate", "predict"):
        object.__setattr__(model, name, counting_replica_batches(getattr(model, name), model))


def on_ipu(model):
    return getattr(model, "_ipu_tf_strategy", None) is not None


def _accumulation(model):
    """(count, reduction method) of the model's gradient accumulation, or
    (1, None). A pipelined model (set_pipelining_options) trains with the
    numbers of gradient accumulation over its micro-batches, which are a
    pipeline's numbers; its stages are placed on their IPUs (_pipeline)."""
    options = getattr(model, "_ipu_options", None)
    if options is None:
        return 1, None
    count = getattr(options, "pipelining_gradient_accumulation_steps_per_replica", None)
    if not count:
        count = getattr(options, "gradient_accumulation_steps_per_replica", None)
    if not count or count == 1:
        return 1, None
    return int(count), options.gradient_accumulation_reduction_method


def _is_pipelined(model):
    is_pipelined = getattr(model, "_ipu_is_pipelined", None)
    return is_pipelined is not None and is_pipelined()


def _pipeline(model, kind):
    """The IPU of each stage of a pipelined model (Graphcore's checks), or
    None. Its forward pass runs stage by stage, each stage's ops in the
    name scope pipeline_stage_<k> (models/staged_graph.py), by which the
    front end places them (stages.py): the program runs on the stages'
    IPUs, with the copies between them, as on the ipu backend."""
    if not _is_pipelined(model):
        return None
    from keras_ipu.models.functions import check_pipeline

    return tuple(check_pipeline(model, training=kind == "train"))


def replication_factor(model):
    """Replicas of the model's program: the device's IPUs over the IPUs one
    replica spans (a pipeline's shards), as on the ipu backend."""
    per_model = getattr(model, "_get_replication_factor", None)
    if per_model is not None:
        return per_model()  # the extension method (models/extension.py)
    strategy = model._ipu_tf_strategy
    return strategy._replication_factor() if hasattr(strategy, "_replication_factor") else 1


def counting_replica_batches(method, model):
    """`method` (fit, evaluate or predict) with Keras counting the batches
    of every replica: during the call `steps_per_execution` is multiplied
    by the replication factor, so Keras hands each execution the batches of
    all replicas (its epoch ends when the data does)."""

    def call(*args, **kwargs):
        replicas = replication_factor(model)
        if replicas == 1:
            return method(*args, **kwargs)
        steps = model.steps_per_execution
        model.steps_per_execution = steps * replicas
        try:
            return method(*args, **kwargs)
        finally:
            model.steps_per_execution = steps

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call


class _Execution:
    """One kind of execution (train, test, predict) of a model: its infeed,
    outfeed and compiled loop per element spec (and, for a pipelined
    model's inference, per number of steps: see _program)."""

    def __init__(self, model, kind):
        self.model = model
        self.kind = kind
        self._by_spec = {}
        self.runs = 0  # program runs (one per execution)

    def _parts(self, element_spec, replicas):
        import tensorflow as tf

        key = (replicas,) + tuple((tuple(s.shape.as_list()), s.dtype.name)
                                  for s in tf.nest.flatten(element_spec))
        parts = self._by_spec.get(key)
        if parts is None:
            parts = self._make(element_spec, replicas)
            self._by_spec[key] = parts
        return parts

    def _make(self, element_spec, replicas):
        import tensorflow as tf

        model = self.model
        source = _SpecOnly(element_spec)
        infeed = Infeed(source, name=f"{model.name} {self.kind} infeed")
        outfeed = Outfeed("all" if self.kind == "predict" else "last",
                          name=f"{model.name} {self.kind} outfeed")
        count, method = _accumulation(model) if self.kind == "train" else (1, None)

        if self.kind == "train" and (count > 1 or replica_context.participants(replicas) > 1):
            def loop(n):
                for _ in tf.range(n // count):
                    _accumulated_step(model, infeed, outfeed, count, method, replicas)
        else:
            step = {"train": model.train_step, "test": model.test_step,
                    "predict": model.predict_step}[self.kind]

            def loop(n):
                for _ in tf.range(n):
                    outfeed.enqueue(step(infeed.dequeue()))

        loop.__name__ = f"{self.kind}_loop"
        programs = {}
        return infeed, outfeed, (loop, programs), count, replicas

    def _program(self, parts, steps):
        """The program running `steps` steps of `parts`. A pipelined
        model's inference program is compiled for its number of steps:
        Graphcore pipelines inference too (forward stages only), over the
        execution's steps per replica (its micro-batches: checked as the
        ipu backend checks them), so its prediction follows the schedule
        with that many micro-batches; every other program serves any
        number of steps (TensorFlow traces each number anyway: a Python
        int argument)."""
        import tensorflow as tf

        model = self.model
        _, _, (loop, programs), count, _ = parts
        mapping = _pipeline(model, self.kind)
        inference = mapping is not None and self.kind != "train"
        key = steps if inference else None
        program = programs.get(key)
        if program is not None:
            return program
        if mapping is None:
            program = bridge(tf.function(loop, jit_compile=True))
        else:
            from keras_ipu.models.functions import check_pipeline_iterations
            from keras_ipu.models.functions import staged_step
            from keras_ipu.ops.pipeline_placement import PipelinePlacement

            schedule = model._ipu_options.pipeline_schedule
            if inference:
                check_pipeline_iterations(steps, schedule, mapping, training=False)
                # The loop's micro-batches: one per step (a while loop: the
                # cost model cannot know its trip count).
                placement = PipelinePlacement.of(
                    mapping, schedule, None, training=False, stage_of=pipeline_stage_of,
                    loop_micro_batches=steps)
            else:
                # A training loop's micro-batch loop runs `count`
                # micro-batches per weight update.
                placement = PipelinePlacement.of(
                    mapping, schedule, count, stage_of=pipeline_stage_of,
                    loop_micro_batches=count)
            program = BridgedFunction(tf.function(staged_step(model, loop), jit_compile=True),
                                      placement=placement)
        # Metric variables are non-trainable variables like moving statistics;
        # the model knows which they are (its profile's "metric state").
        program.known_variables = lambda: {
            id(v.value): "metric state" for v in model.metrics_variables}
        programs[key] = program
        return program

    def programs(self):
        """The BridgedFunctions made for this kind so far."""
        return [program for parts in self._by_spec.values() for program in parts[2][1].values()]

    def executables(self):
        """The Executables compiled for this kind so far and still cached
        (memory per IPU, prediction, profile)."""
        return [exe for program in self.programs() for exe in program.executables()]

    def run(self, iterator, element_spec, batches, replicas=None):
        """Run the steps of `batches` batches (replicas x steps) on
        `iterator`'s elements; returns the outfeed's (structure, values).
        Raises StopIteration when there is no data."""
        import tensorflow as tf

        replicas = replication_factor(self.model) if replicas is None else replicas
        parts = self._parts(element_spec, replicas)
        infeed, outfeed, _, count, replicas = parts
        steps = batches // replicas
        if steps % count:
            # Each execution runs whole optimizer steps: Graphcore's check
            # and message, as the ipu backend's (models/extension.py).
            self.model._ipu_check_accumulation(steps, count)
        program = self._program(parts, steps)
        infeed.rebind(iterator)
        infeed.begin_execution()
        outfeed.take()
        self.runs += 1
        try:
            with _workload(element_spec, steps, count):
                program.run((steps,), replicas=replicas)
        except tf.errors.OutOfRangeError:
            done = infeed.recorded // replicas
            done -= done % count
            if done == 0:
                raise StopIteration from None
            infeed.replay_execution()
            outfeed.take()
            with _workload(element_spec, done, count):
                self._program(parts, done).run((done,), replicas=replicas)
        return outfeed.take()


def _workload(element_spec, steps, count):
    """What a run of `steps` steps does, for its program's prediction (as
    the ipu backend's device loop says it): a step is one weight update of
    `count` micro-batches (count is 1 but in training with accumulation),
    its samples the batch of one replica's micro-batches."""
    import tensorflow as tf

    from keras_ipu.device.compiler import device_checks

    sizes = [s.shape[0] for s in tf.nest.flatten(element_spec) if s.shape.rank]
    batch = sizes[0] if sizes and sizes[0] is not None else None
    return device_checks.workload(batch_size=batch and batch * count,
                                  steps_per_run=steps // count)


class _SpecOnly:
    """An iterator source with an element spec and no elements yet (the
    execution rebinds the infeed to each epoch's iterator)."""

    def __init__(self, element_spec):
        self.element_spec = element_spec

    def __next__(self):
        raise StopIteration


def _accumulated_step(model, infeed, outfeed, count, method, replicas):
    """One optimizer step over `count` micro-batches, Keras' train_step
    split at the weight update: the gradients are combined by `method`
    (SUM for one micro-batch) and, on several replicas, averaged across
    them (all-reduce) before the update."""
    import tensorflow as tf
    from keras.src import tree
    from keras.src.losses import loss as loss_module
    from keras.src.trainers.data_adapters import data_adapter_utils

    from keras_ipu.gradient_accumulation import GradientAccumulationReductionMethod as Method

    weights = model.trainable_weights
    acc = [tf.zeros(w.shape, w.dtype) for w in weights]
    for k in tf.range(count):
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(infeed.dequeue())
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                       training=True)
            model._loss_tracker.update_state(
                loss_module.unscale_loss_for_distribution(loss),
                sample_weight=tf.shape(next(i for i in tree.flatten(x) if i is not None))[0])
            if model.optimizer is not None:
                loss = model.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, weights)
        n = tf.cast(k, tf.float32)
        new = []
        for a, g in zip(acc, grads):
            g = tf.zeros_like(a) if g is None else tf.cast(g, a.dtype)
            if method is Method.SUM:
                new.append(a + g)
            elif method is Method.MEAN:
                new.append(a + g * (1.0 / count))
            else:  # RUNNING_MEAN
                n_a = tf.cast(n, a.dtype)
                new.append(a * (n_a / (n_a + 1.0)) + g / (n_a + 1.0))
        acc = new
        outfeed.enqueue(model.compute_metrics(x, y, y_pred, sample_weight=sample_weight))
    # The mean over every replica of the job (a multi-process job's other
    # instances too, also with one replica per instance).
    acc = [replica_context.all_reduce("MEAN", a, replicas) for a in acc]
    model.optimizer.apply_gradients(zip(acc, weights))


def _logs(model, structure, values):
    """The logs of the last step; with replication, combined across the
    replicas by the model's replicated_metric_reduction_method."""
    import tensorflow as tf

    leaves = [np.asarray(v[-1]) for v in values]
    if replication_factor(model) > 1:
        options = getattr(model, "_ipu_options", None)
        method = getattr(getattr(options, "replicated_metric_reduction_method", None), "name", "NONE")
        reduce = {"NONE": lambda v: v[-1], "LIST": lambda v: list(v),
                  "SUM": lambda v: np.sum(v, axis=0), "MEAN": lambda v: np.mean(v, axis=0)}[method]
        leaves = [reduce(v) for v in leaves]
    return tf.nest.pack_sequence_as(structure, leaves)


def _make_logs_function(model, kind, force):
    """Keras' train_function / test_function for `kind`: runs an execution
    of the iterator's batches and returns the logs."""
    attribute = f"{kind}_function"
    if getattr(model, attribute) is not None and not force:
        return getattr(model, attribute)
    execution = _Execution(model, kind)

    def function(iterator):
        structure, values = execution.run(iterator, iterator.element_spec, model.steps_per_execution)
        return _logs(model, structure, values)

    function.execution = execution
    setattr(model, attribute, function)
    return function


def make_train_function(model, force=False):
    return _make_logs_function(model, "train", force)


def make_test_function(model, force=False):
    return _make_logs_function(model, "test", force)


def make_predict_function(model, force=False):
    if model.predict_function is not None and not force:
        return model.predict_function
    execution = _Execution(model, "predict")

    def function(data):
        import tensorflow as tf

        # A program per run of batches of one shape (the last batch of the
        # data may be smaller).
        runs = []
        replicas = replication_factor(model)
        for batch in data:
            batch = tf.nest.map_structure(tf.convert_to_tensor, batch)
            spec = tf.nest.map_structure(tf.TensorSpec.from_tensor, batch)
            if runs and runs[-1][0] == spec:
                runs[-1][1].append(batch)
            else:
                runs.append((spec, [batch]))
        pieces, structure = [], None
        for spec, batches in runs:
            # Whole rounds of batches on every replica, the rest on one.
            split = len(batches) - len(batches) % replicas
            for part, n in ((batches[:split], replicas), (batches[split:], 1)):
                if not part:
                    continue
                structure, values = execution.run(iter(part), spec, len(part), replicas=n)
                if n > 1:
                    # Step k of replica r predicted batch k * replicas + r.
                    values = [[row for v in leaf for row in v] for leaf in values]
                pieces.append(values)
        leaves = [tf.convert_to_tensor(np.concatenate([v for p in pieces for v in p[i]], axis=0))
                  for i in range(len(pieces[0]))]
        return tf.nest.pack_sequence_as(structure, leaves)

    function.execution = execution
    model.predict_function = function
    return function

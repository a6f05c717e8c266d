"""Keras' Trainer (fit/evaluate/predict) for the ipu backend.

The steps are stateless, as in Keras' JAX trainer (DESIGN.md decision 6):
`train_step(state, data) -> (logs, state)` takes the values of the
trainable, non-trainable (random seeds included), optimizer and metrics
variables and returns their new values; `test_step` and `predict_step`
take the state they read. A custom step overrides these signatures.

One *execution* takes the `steps_per_execution` batches the epoch iterator
hands over (the infeed) and runs them in the device loop
(trainer_ops/device_loop.py): compiled, that loop is ONE executable, a scan
of the step over the stacked batches; with `run_eagerly=True` (or
`jit_compile=False`) the same step runs op by op on the host. After each
execution the new state is written back to the Keras variables, so
callbacks see the current weights, and the logs of its last step go to the
callbacks; when no callback listens to fit's batches, the train state is
kept between executions and written when the epoch's executions end
(trainer_ops/held_state.py).
"""

import contextlib
import inspect
import warnings

import numpy as np

from keras.src import backend
from keras.src import callbacks as callbacks_module
from keras.src import optimizers as optimizers_module
from keras.src import tree
from keras.src import utils
from keras.src.backend import config
from keras.src.trainers import trainer as base_trainer
from keras.src.trainers.data_adapters import array_slicing
from keras.src.trainers.data_adapters import data_adapter_utils
from keras.src.trainers.epoch_iterator import EpochIterator
from keras.src.utils import traceback_utils
from keras.src.utils.python_utils import pythonify_logs

from keras_ipu.backend.trainer_ops import loss_scaling
from keras_ipu.backend.trainer_ops import model_state
from keras_ipu.backend.trainer_ops.device_loop import DeviceLoop
from keras_ipu.backend.trainer_ops.device_loop import concatenate_steps
from keras_ipu.backend.trainer_ops.device_loop import every_step
from keras_ipu.backend.trainer_ops.device_loop import last_step
from keras_ipu.backend.trainer_ops.held_state import HeldState
from keras_ipu.device.interrupts import deferred_interrupts
from keras_ipu.device.autodiff import value_and_grad
from keras_ipu.device.config import system_config
from keras_ipu.device.simulator.numerics import IPUFloatingPointError
from keras_ipu.device.trace import default_source
from keras_ipu.report.graph_def import GraphSource
from keras_ipu.distribute import scope as _strategy_scope


class IPUEpochIterator(EpochIterator):
    """Hands out one execution's batches at a time (the infeed).

    When the number of batches is known from the data (not from
    `steps_per_epoch`), the last execution of an epoch is shortened to the batches that remain (Keras' iterator would pull past
    the end and warn that the input ran out). Its end step stays
    `begin_step + steps_per_execution - 1`, the index Keras' iterator and
    callbacks use for every execution. Running
    out of a generator of unknown length is the normal end of predict() and
    evaluate(); it only warns when the user asked for more `steps`.
    """

    _peeked = None

    def peek_first_batch(self):
        """The first batch of the next epoch, or None for empty input.

        The execution it belongs to is handed out again as the first item
        of the next iteration, so nothing is lost even from a one-shot
        generator; this lets the model be built before any callback runs,
        as Keras' other backends do.
        """
        self._peeked = None
        try:
            self._peeked = next(iter(self))
        except StopIteration:
            return None
        return self._peeked[2][0]

    def __iter__(self):
        if self._peeked is not None:
            return self  # continue the epoch the peek began
        return super().__iter__()

    def __next__(self):
        if self._peeked is not None:
            item, self._peeked = self._peeked, None
            return item
        begin_step, _, iterator = next(self._epoch_iterator)
        count = self.steps_per_execution
        if self.num_batches and not self.steps_per_epoch:
            # With an explicit steps_per_epoch Keras runs whole executions
            # (the data iterator carries over into the next epoch); only
            # the end of the data shortens one.
            count = max(1, min(count, self.num_batches - begin_step))
        batches = []
        with self.catch_stop_iteration():
            for _ in range(count):
                batches.append(next(iterator))
        if not batches:
            raise StopIteration
        return begin_step, begin_step + self.steps_per_execution - 1, batches

    def _interrupted_warning(self):
        if self.steps_per_epoch:
            super()._interrupted_warning()


def _check_stateless_signature(step):
    """A step written for a stateful backend (`train_step(self, data)`)
    fails here with the fix, not deep inside the device loop."""
    try:
        params = inspect.signature(step).parameters.values()
    except (TypeError, ValueError):
        return
    positional = [
        p for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if any(p.kind == p.VAR_POSITIONAL for p in params) or len(positional) >= 2:
        return
    name = getattr(step, "__name__", "step")
    raise TypeError(
        f"`{name}` takes {len(positional)} argument(s) besides self, but the "
        "ipu backend runs stateless steps, as Keras' JAX backend does: "
        f"`def {name}(self, state, data)` returning `(logs, state)` "
        "(predict_step: `(outputs, state)`). Override it with that "
        "signature, calling `super().{name}(state, data)` for the default "
        "behaviour."
    )


def _fp_traps_on():
    """Whether programs compiled now trap floating-point exceptions."""
    behaviour = system_config.configuration().fp_behaviour
    return bool(getattr(behaviour, "traps", False))


# A loop's batch hooks, with the older ones Keras' default hooks forward to
# (Callback.on_train_batch_end calls on_batch_end).
_BATCH_HOOKS = {
    "train": ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end"),
    "test": ("on_test_batch_begin", "on_test_batch_end"),
    "predict": ("on_predict_batch_begin", "on_predict_batch_end"),
}


# Callbacks whose batch hooks read the logs they are given and never the
# model (this exact class, not a subclass): Keras' progress bar.
_LOGS_ONLY = (callbacks_module.ProgbarLogger,)


def _batch_listeners(callbacks, kind):
    """The callbacks of the CallbackList `callbacks` that do anything in
    the batch hooks of `kind` (train: fit, test: evaluate); None (anyone
    may) for a subclass of CallbackList."""
    if type(callbacks) is not callbacks_module.CallbackList:
        return None
    return [
        callback for callback in callbacks.callbacks
        if any(not utils.is_default(getattr(callback, hook, None))
               for hook in _BATCH_HOOKS[kind])
    ]


def _batch_hooks_heard(callbacks, kind):
    """Whether a callback does anything in the batch hooks of `kind`; a
    callback without Keras' default hooks counts as heard."""
    listeners = _batch_listeners(callbacks, kind)
    return listeners is None or bool(listeners)


def _batch_hooks_see_model(callbacks, kind):
    """Whether a batch hook of `kind` may look at the model (any listener
    but the progress bar): then fit, evaluate or predict writes the state
    after every execution instead of holding it (held_state.py)."""
    listeners = _batch_listeners(callbacks, kind)
    return listeners is None or any(type(c) not in _LOGS_ONLY for c in listeners)


def _first_array(x):
    return next(i for i in tree.flatten(x) if i is not None)


class IPUTrainer(base_trainer.Trainer):
    def __init__(self):
        super().__init__()
        self.train_function = None
        self.test_function = None
        self.predict_function = None
        # A model made in an IPUStrategy scope gets the IPU extensions.
        _strategy_scope.on_model_created(self)

    # ------------------------------------------------------------------
    # The stateless steps

    def compute_loss_and_updates(
        self,
        trainable_variables,
        non_trainable_variables,
        metrics_variables,
        x,
        y,
        sample_weight,
        training=False,
        optimizer_variables=None,
    ):
        """The (scaled) loss and (unscaled loss, y_pred, new non-trainable
        values, new metrics values); stateless, so it can be differentiated
        with respect to `trainable_variables`."""
        kwargs = {}
        if self._call_has_training_arg:
            kwargs["training"] = training
        y_pred, non_trainable_variables, losses = self.stateless_call(
            trainable_variables,
            non_trainable_variables,
            x,
            return_losses=True,
            **kwargs,
        )
        if losses:
            # compute_loss reads the forward pass' layer losses from here.
            self._losses_override.clear()
            self._losses_override = losses
        loss, variables = self.stateless_compute_loss(
            trainable_variables,
            non_trainable_variables,
            metrics_variables,
            x=x,
            y=y,
            y_pred=y_pred,
            sample_weight=sample_weight,
            training=training,
        )
        if losses:
            self._losses_override.clear()
        _, non_trainable_variables, metrics_variables = variables
        unscaled_loss = loss
        if training and self.optimizer is not None:
            # A LossScaleOptimizer reads its scale from its own variables.
            mapping = list(zip(self.optimizer.variables, optimizer_variables))
            with backend.StatelessScope(state_mapping=mapping):
                loss = self.optimizer.scale_loss(loss)
        return loss, (
            unscaled_loss,
            y_pred,
            non_trainable_variables,
            metrics_variables,
        )

    def _update_metrics_variables(
        self, metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
    ):
        mapping = list(zip(self.metrics_variables, metrics_variables))
        # Profiles attribute these steps to "metrics", not to "(no layer)"
        # (node sources only: variable paths stay as Keras makes them).
        with backend.StatelessScope(state_mapping=mapping) as scope, \
                default_source("metrics"):
            self._loss_tracker.update_state(
                unscaled_loss, sample_weight=_first_array(x).shape[0]
            )
            logs = self.compute_metrics(x, y, y_pred, sample_weight)
        new_values = []
        for variable in self.metrics_variables:
            value = scope.get_current_value(variable)
            new_values.append(variable.value if value is None else value)
        return logs, new_values

    def train_step(self, state, data):
        (
            trainable_variables,
            non_trainable_variables,
            optimizer_variables,
            metrics_variables,
        ) = state
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)

        def loss_of(trainable):
            return self.compute_loss_and_updates(
                trainable,
                non_trainable_variables,
                metrics_variables,
                x,
                y,
                sample_weight,
                training=True,
                optimizer_variables=optimizer_variables,
            )

        (_, aux), grads = value_and_grad(loss_of, has_aux=True)(
            list(trainable_variables)
        )
        unscaled_loss, y_pred, non_trainable_variables, metrics_variables = aux
        trainable_variables, optimizer_variables = (
            self.optimizer.stateless_apply(
                optimizer_variables, grads, trainable_variables
            )
        )
        logs, metrics_variables = self._update_metrics_variables(
            metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
        )
        state = (
            trainable_variables,
            non_trainable_variables,
            optimizer_variables,
            metrics_variables,
        )
        return logs, state

    def test_step(self, state, data):
        trainable_variables, non_trainable_variables, metrics_variables = state
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        _, aux = self.compute_loss_and_updates(
            trainable_variables,
            non_trainable_variables,
            metrics_variables,
            x,
            y,
            sample_weight,
            training=False,
        )
        unscaled_loss, y_pred, non_trainable_variables, metrics_variables = aux
        logs, metrics_variables = self._update_metrics_variables(
            metrics_variables, unscaled_loss, x, y, y_pred, sample_weight
        )
        return logs, (
            trainable_variables,
            non_trainable_variables,
            metrics_variables,
        )

    def predict_step(self, state, data):
        trainable_variables, non_trainable_variables = state
        x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(data)
        kwargs = {}
        if self._call_has_training_arg:
            kwargs["training"] = False
        outputs, non_trainable_variables = self.stateless_call(
            trainable_variables, non_trainable_variables, x, **kwargs
        )
        return outputs, (trainable_variables, non_trainable_variables)

    # ------------------------------------------------------------------
    # One execution: the model's state and a list of batches in, the steps'
    # outputs (chunks, see device_loop) out; the new state is written back.

    def _runs_compiled(self):
        return not self.run_eagerly and self.jit_compile

    def _make_execution(self, step, kinds, donate_state=False):
        _check_stateless_signature(step)
        compiled = self._runs_compiled()
        # A train step replaces the whole state: the compiled program may
        # update it in place (donation, as Keras' JAX trainer does), given
        # arrays nobody else holds (read_owned_state).
        donate = donate_state and compiled
        loop = DeviceLoop(step, compiled=compiled, donate_state=donate,
                          state_kinds=kinds)
        read = model_state.read_owned_state if donate else model_state.read_state

        held = None  # a HeldState while `holding`

        def run_execution(batches):
            # A Ctrl-C waits until the whole state is stored (interrupts.py).
            with deferred_interrupts(f"the running execution ({len(batches)} steps)"):
                hold = held
                variables = copies = None
                try:
                    if hold is not None and hold.flat is not None:
                        chunks = loop.run_held(hold, batches)
                        if chunks is not None:
                            return chunks
                        state = hold.state()
                    else:
                        variables = model_state.state_variables(self, kinds)
                        # A floating-point trap can stop the program midway:
                        # then it updates copies, and the variables stay whole.
                        copies = donate and _fp_traps_on()
                        state = (model_state.read_copied_state if copies else read)(variables)
                    chunks, state = loop(state, batches)
                except Exception as e:
                    if donate and not copies:
                        e.add_note(model_state.TORN_STATE_NOTE)
                    raise
                if hold is not None:
                    hold.keep(variables, state)
                else:
                    model_state.write_state(variables, kinds, state, private=donate)
            return chunks

        @contextlib.contextmanager
        def holding():
            """Within: the state stays out of the variables between this
            function's executions (held_state.py); leaving writes it to
            them. Only for a compiled step without floating-point traps
            (a train step then runs on copies): fit's, and evaluate's and
            predict's, which give back the state they read (their metrics
            and seeds new, the weights as they were)."""
            nonlocal held
            if not compiled or held is not None or _fp_traps_on():
                yield
                return
            held = HeldState(kinds, private=donate)
            try:
                yield
            finally:
                hold, held = held, None
                # A Ctrl-C waits until every variable has the state.
                with deferred_interrupts("storing the model's state"):
                    hold.write()

        run_execution.device_loop = loop
        run_execution.holding = holding
        return run_execution

    # kind -> (its step, the state it reads and writes, whether it donates
    # that state, how the outputs of an execution's steps become its result)
    _FUNCTIONS = {
        "train": ("train_step", model_state.TRAIN_STATE, True, last_step),
        "test": ("test_step", model_state.TEST_STATE, False, last_step),
        "predict": ("predict_step", model_state.PREDICT_STATE, False, concatenate_steps),
    }

    def _make_function(self, kind, force):
        """The `{kind}_function` of the model (made once): one execution of
        its step over a list of batches."""
        attribute = f"{kind}_function"
        if getattr(self, attribute) is not None and not force:
            return getattr(self, attribute)
        step, kinds, donate, combine = self._FUNCTIONS[kind]
        execution = self._make_execution(getattr(self, step), kinds, donate_state=donate)

        def run(batches, step_logs=None):
            try:
                chunks = execution(batches)
                if step_logs is not None:
                    step_logs.extend(every_step(chunks))
                return combine(chunks)
            except IPUFloatingPointError as e:
                if kind != "train":
                    raise
                raise loss_scaling.explain_overflow(self, e) from None

        run.__name__ = f"run_{kind}_execution"
        run.device_loop = execution.device_loop
        run.holding = execution.holding
        setattr(self, attribute, run)
        return run

    def make_train_function(self, force=False):
        function = self._make_function("train", force)
        # Keras' TensorBoard callback writes a tf.function's graph
        # (write_graph=True): these two attributes give it the compiled
        # program's, as a GraphDef named by Keras layer (report/graph_def.py).
        if function.device_loop.compiled and not hasattr(function, "_concrete_stateful_fn"):
            function.function_spec = None
            function._concrete_stateful_fn = GraphSource(function.device_loop)
        return function

    def make_test_function(self, force=False):
        return self._make_function("test", force)

    def make_predict_function(self, force=False):
        return self._make_function("predict", force)

    def _make_epoch_iterator(self, mode, **kwargs):
        """The infeed of fit, evaluate or predict (`mode`); a model made in an
        IPUStrategy scope hands out its batches by the IPU's rules
        (keras_ipu/models/data.py)."""
        return IPUEpochIterator(**kwargs)

    def _build_for_prediction(self, batch):
        """Create an unbuilt model's variables from its first batch, before
        the state is read (a compiled step cannot create variables)."""
        if all(layer.built for layer in self._flatten_layers()):
            return
        x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(batch)
        with backend.StatelessScope():
            self._call_for_inference(x)

    def _call_for_inference(self, x):
        if self._call_has_training_arg:
            return self(x, training=False)
        return self(x)

    # ------------------------------------------------------------------
    # The loops

    @traceback_utils.filter_traceback
    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        epochs=1,
        verbose="auto",
        callbacks=None,
        validation_split=0.0,
        validation_data=None,
        shuffle=True,
        class_weight=None,
        sample_weight=None,
        initial_epoch=0,
        steps_per_epoch=None,
        validation_steps=None,
        validation_batch_size=None,
        validation_freq=1,
    ):
        self._assert_compile_called("fit")
        max_epochs = config.max_epochs()
        if max_epochs and max_epochs < epochs:
            warnings.warn("Limiting epochs to %d" % max_epochs)
            epochs = max_epochs
        self._eval_epoch_iterator = None
        if validation_split and validation_data is None:
            (x, y, sample_weight), validation_data = (
                array_slicing.train_validation_split(
                    (x, y, sample_weight), validation_split=validation_split
                )
            )
        if validation_data is not None:
            val_x, val_y, val_sample_weight = (
                data_adapter_utils.unpack_x_y_sample_weight(validation_data)
            )

        epoch_iterator = self._epoch_iterator(
            "fit", x, y, sample_weight, batch_size, steps_per_epoch, shuffle, class_weight
        )
        first_batch = self._first_batch(epoch_iterator, "train")

        callbacks = self._callback_list(
            callbacks, verbose, epoch_iterator, epochs=epochs, add_history=True
        )

        self.stop_training = False
        training_logs = {}
        logs = {}
        training_finished = False
        callbacks.on_train_begin()
        initial_epoch = self._initial_epoch or initial_epoch
        try:
            for epoch in range(initial_epoch, epochs):
                self.reset_metrics()
                callbacks.on_epoch_begin(epoch)
                logs = self._run_executions(
                    epoch_iterator, self.train_function,
                    *self._batch_callbacks(callbacks, "train"), "stop_training", logs,
                    per_step=self._asynchronous_callbacks(),
                    hold=not _batch_hooks_see_model(callbacks, "train"))

                epoch_logs = dict(self._get_metrics_result_or_logs(logs))
                if validation_data is not None and self._should_eval(
                    epoch, validation_freq
                ):
                    if getattr(self, "_eval_epoch_iterator", None) is None:
                        self._eval_epoch_iterator = self._epoch_iterator(
                            "evaluate", val_x, val_y, val_sample_weight,
                            validation_batch_size or batch_size, validation_steps,
                        )
                    val_logs = self.evaluate(
                        x=val_x,
                        y=val_y,
                        sample_weight=val_sample_weight,
                        batch_size=validation_batch_size or batch_size,
                        steps=validation_steps,
                        callbacks=callbacks,
                        return_dict=True,
                        _use_cached_eval_dataset=True,
                    )
                    epoch_logs.update(
                        {f"val_{name}": val for name, val in val_logs.items()}
                    )

                callbacks.on_epoch_end(epoch, epoch_logs)
                training_logs = epoch_logs
                if self.stop_training:
                    break
            training_finished = True
        finally:
            if (
                isinstance(self.optimizer, optimizers_module.Optimizer)
                and epochs > 0
                and first_batch is not None
            ):
                self.optimizer.finalize_variable_values(self.trainable_weights)
            if getattr(self, "_eval_epoch_iterator", None) is not None:
                del self._eval_epoch_iterator
            if training_finished:
                callbacks.on_train_end(logs=training_logs)
        return self.history

    def _epoch_iterator(self, mode, x=None, y=None, sample_weight=None, batch_size=None,
                        steps=None, shuffle=False, class_weight=None):
        """The infeed of a fit/evaluate/predict loop (`mode`):
        steps_per_execution batches at a time."""
        return self._make_epoch_iterator(
            mode, x=x, y=y, sample_weight=sample_weight, batch_size=batch_size,
            steps_per_epoch=steps, shuffle=shuffle, class_weight=class_weight,
            steps_per_execution=self.steps_per_execution)

    def _first_batch(self, epoch_iterator, kind):
        """The first batch of the loop (None for empty input), with which
        the model is built and its `{kind}_function` made before any
        callback runs."""
        first_batch = epoch_iterator.peek_first_batch()
        if first_batch is not None:
            if kind == "predict":
                self._build_for_prediction(first_batch)
            else:
                self._symbolic_build(data_batch=first_batch)
            getattr(self, f"make_{kind}_function")()  # a subclass may override it
        return first_batch

    def _run_executions(self, epoch_iterator, function, on_begin, on_end, stop_flag, last,
                        per_step=False, hold=False):
        """Runs `function` on each execution's batches of an epoch between its
        callbacks, until the data ends or the model's `stop_flag` is set;
        returns the last result (`last` when none ran).

        per_step (fit and evaluate with set_asynchronous_callbacks(True)):
        the batch callbacks run for every step, with the logs the function
        puts in its `step_logs` list; a function that leaves it empty
        (Graphcore's accumulate_outfeed) gets them once per execution.
        on_begin None: no batch callback at all (_batch_callbacks).
        hold: nothing between two executions looks at the model (no batch
        callback but the progress bar): the function may keep the state out
        of the variables until the loop ends (held_state.py); a function of
        its own (a subclass', a wrapper) has no `holding` and writes it
        after each execution."""
        holding = getattr(function, "holding", None) if hold else None
        with holding() if holding is not None else contextlib.nullcontext():
            return self._run_executions_of(epoch_iterator, function, on_begin, on_end,
                                           stop_flag, last, per_step)

    def _run_executions_of(self, epoch_iterator, function, on_begin, on_end, stop_flag, last,
                           per_step):
        if on_begin is None:
            # One execution after the other on this thread, where Keras' JAX
            # loop takes the next batch while XLA runs the step. Overlapping
            # ours (the executions on a worker thread while this one takes
            # the next batches, or the batches taken by a thread of their
            # own) did not pay on 2 cores: the Python outside the programs
            # is 0.2-0.3 CPU ms of an MLP or demo_functional step, and under
            # load the step is bound by CPU, which the handoffs add to
            # (benchmarks/README.md, issue 16, nineteenth pass (s19step)).
            for _, _, batches in epoch_iterator:
                last = function(batches)
                if getattr(self, stop_flag):
                    break
            return last
        for begin_step, end_step, batches in epoch_iterator:
            on_begin(begin_step)
            steps = []
            last = function(batches, step_logs=steps) if per_step else function(batches)
            if steps:
                # As Graphcore's callback thread calls them while the device
                # runs on; here the execution has already run.
                for k, logs in enumerate(steps):
                    if k:
                        on_begin(begin_step + k)
                    on_end(begin_step + k, logs)
            else:
                on_end(end_step, last)
            if getattr(self, stop_flag):
                break
        return last

    def _batch_callbacks(self, callbacks, kind):
        """(on_begin, on_end) of the CallbackList for `kind`'s batches, or
        (None, None) when no callback in it does anything there (fit or
        evaluate with verbose=0 and only epoch-level callbacks): calling
        them would convert the logs and hand them to Keras' callback thread,
        a thread woken per step for nothing (issue 16, sixth pass)."""
        if not _batch_hooks_heard(callbacks, kind):
            return None, None
        return (getattr(callbacks, f"on_{kind}_batch_begin"),
                getattr(callbacks, f"on_{kind}_batch_end"))

    def _asynchronous_callbacks(self):
        """Whether an IPU-extended model asked for per-step callbacks."""
        options = getattr(self, "_ipu_options", None)
        return bool(options is not None and options.asynchronous_callbacks)

    def _callback_list(
        self, callbacks, verbose, epoch_iterator, epochs=1, add_history=False
    ):
        """The CallbackList of a fit/evaluate/predict loop, with Keras'
        progress bar (unless the caller passed a CallbackList)."""
        if isinstance(callbacks, callbacks_module.CallbackList):
            return callbacks
        return callbacks_module.CallbackList(
            callbacks,
            add_history=add_history,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=epoch_iterator.num_batches,
            model=self,
        )

    @traceback_utils.filter_traceback
    def evaluate(
        self,
        x=None,
        y=None,
        batch_size=None,
        verbose="auto",
        sample_weight=None,
        steps=None,
        callbacks=None,
        return_dict=False,
        **kwargs,
    ):
        self._assert_compile_called("evaluate")
        use_cached_eval_dataset = kwargs.pop("_use_cached_eval_dataset", False)
        if kwargs:
            raise ValueError(f"Arguments not recognized: {kwargs}")

        if use_cached_eval_dataset:
            epoch_iterator = self._eval_epoch_iterator
        else:
            epoch_iterator = self._epoch_iterator("evaluate", x, y, sample_weight, batch_size, steps)
        self._first_batch(epoch_iterator, "test")
        callbacks = self._callback_list(callbacks, verbose, epoch_iterator)

        self.stop_evaluating = False
        callbacks.on_test_begin()
        self.reset_metrics()
        logs = self._run_executions(
            epoch_iterator, self.test_function,
            *self._batch_callbacks(callbacks, "test"), "stop_evaluating", {},
            per_step=self._asynchronous_callbacks(),
            hold=not _batch_hooks_see_model(callbacks, "test"))
        logs = pythonify_logs(self._get_metrics_result_or_logs(logs))
        callbacks.on_test_end(logs)

        if return_dict:
            return logs
        return self._flatten_metrics_in_order(logs)

    @traceback_utils.filter_traceback
    def predict(
        self, x, batch_size=None, verbose="auto", steps=None, callbacks=None
    ):
        epoch_iterator = self._epoch_iterator("predict", x, batch_size=batch_size, steps=steps)
        self._first_batch(epoch_iterator, "predict")
        callbacks = self._callback_list(callbacks, verbose, epoch_iterator)

        self.stop_predicting = False
        callbacks.on_predict_begin()
        collected = None

        def collect(end_step, batch_outputs):
            nonlocal collected
            if collected is None:
                collected = tree.map_structure(lambda out: [out], batch_outputs)
            else:
                tree.map_structure_up_to(
                    batch_outputs,
                    lambda outs, out: outs.append(out),
                    collected,
                    batch_outputs,
                )
            callbacks.on_predict_batch_end(end_step, {"outputs": batch_outputs})

        batch_outputs = self._run_executions(
            epoch_iterator, self.predict_function, callbacks.on_predict_batch_begin,
            collect, "stop_predicting", None,
            hold=not _batch_hooks_see_model(callbacks, "predict"))
        callbacks.on_predict_end()
        if collected is None:
            raise ValueError(
                "predict() received no data: the input yielded no batch. "
                f"Received: x={type(x).__name__}, steps={steps}. Pass at "
                "least one sample (and steps >= 1 if given)."
            )
        return tree.map_structure_up_to(
            batch_outputs, lambda outs: np.concatenate(outs, axis=0), collected
        )

    def train_on_batch(
        self,
        x,
        y=None,
        sample_weight=None,
        class_weight=None,
        return_dict=False,
    ):
        self._assert_compile_called("train_on_batch")
        if class_weight is not None:
            if sample_weight is not None:
                raise ValueError(
                    "Arguments `sample_weight` and `class_weight` cannot be "
                    f"specified at the same time. Received: sample_weight="
                    f"{sample_weight}, class_weight={class_weight}"
                )
            sample_weight = data_adapter_utils.class_weight_to_sample_weights(
                y, class_weight
            )
        return self._run_on_batch(self.make_train_function, "train_function",
                                  (x, y, sample_weight), return_dict)

    def test_on_batch(
        self,
        x,
        y=None,
        sample_weight=None,
        return_dict=False,
    ):
        self._assert_compile_called("test_on_batch")
        return self._run_on_batch(self.make_test_function, "test_function",
                                  (x, y, sample_weight), return_dict)

    def _run_on_batch(self, make_function, function, data, return_dict):
        """train_on_batch / test_on_batch: one execution of one batch, the
        metrics reset first."""
        self._symbolic_build(data_batch=data)
        make_function()
        self.reset_metrics()
        logs = pythonify_logs(getattr(self, function)([data]))
        if return_dict:
            return logs
        return self._flatten_metrics_in_order(logs)

    def predict_on_batch(self, x):
        self._build_for_prediction((x,))
        self.make_predict_function()
        return self.predict_function([(x,)])

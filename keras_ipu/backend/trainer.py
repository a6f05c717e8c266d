"""Keras' Trainer (fit/evaluate/predict) for the ipu backend.

In this milestone inference runs eagerly on the host, op by op: every layer
call executes each primitive's kernel at once, as Keras' op tests do. The
loops already have the shape of the IPU's device loop: one *execution* takes
the `steps_per_execution` batches the EpochIterator hands over (the infeed)
and returns what each step produced (the outfeed, copied to host NumPy
arrays). The compiler (issue 3) will replace the body of an execution with
one compiled program; callbacks, progress bars and data handling stay here.

Training needs that compiler (reverse-mode differentiation of the traced
step), so fit/train_on_batch raise NotImplementedError for now.
"""

import numpy as np

from keras.src import backend
from keras.src import callbacks as callbacks_module
from keras.src import tree
from keras.src.trainers import trainer as base_trainer
from keras.src.trainers.data_adapters import data_adapter_utils
from keras.src.trainers.epoch_iterator import EpochIterator
from keras.src.utils import traceback_utils
from keras.src.utils.python_utils import pythonify_logs

TRAINING_NOT_AVAILABLE = (
    "Training on the ipu backend arrives with the compiler (issue 3); "
    "`{method}()` cannot run yet. Inference works now: predict(), "
    "evaluate(), predict_on_batch() and test_on_batch(). To use a trained "
    "model today, train it with another Keras backend (for example "
    "KERAS_BACKEND=tensorflow), save it with model.save('model.keras') or "
    "model.save_weights('model.weights.h5'), and load that file under "
    "KERAS_BACKEND=ipu."
)


def _to_host(outputs):
    """The outfeed: step outputs as NumPy arrays on the host."""

    def convert(x):
        if x is None or isinstance(x, np.ndarray):
            return x
        if backend.is_tensor(x):
            return backend.convert_to_numpy(x)
        return x

    return tree.map_structure(convert, outputs)


def _concatenate_steps(step_outputs):
    if len(step_outputs) == 1:
        return step_outputs[0]
    return tree.map_structure(
        lambda *xs: np.concatenate(xs, axis=0), *step_outputs
    )


class IPUEpochIterator(EpochIterator):
    """Hands out one execution's batches at a time (the infeed).

    When the number of batches is known, the last execution of an epoch is
    shortened to the batches that remain (Keras' iterator would pull past
    the end and warn that the input ran out), and its end step is the last
    step really run, so callbacks and the progress bar count right. Running
    out of a generator of unknown length is the normal end of predict() and
    evaluate(); it only warns when the user asked for more `steps`.
    """

    def __next__(self):
        begin_step, _, iterator = next(self._epoch_iterator)
        count = self.steps_per_execution
        if self.num_batches:
            count = max(1, min(count, self.num_batches - begin_step))
        batches = []
        with self.catch_stop_iteration():
            for _ in range(count):
                batches.append(next(iterator))
        if not batches:
            raise StopIteration
        return begin_step, begin_step + len(batches) - 1, batches

    def _interrupted_warning(self):
        if self.steps_per_epoch:
            super()._interrupted_warning()


class IPUTrainer(base_trainer.Trainer):
    def __init__(self):
        super().__init__()
        self.train_function = None
        self.test_function = None
        self.predict_function = None

    # ------------------------------------------------------------------
    # One step

    def train_step(self, data):
        raise NotImplementedError(TRAINING_NOT_AVAILABLE.format(method="train_step"))

    def test_step(self, data):
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        y_pred = self._call_for_inference(x)
        loss = self._compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )
        self._loss_tracker.update_state(
            loss, sample_weight=tree.flatten(x)[0].shape[0]
        )
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def predict_step(self, data):
        x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(data)
        return self._call_for_inference(x)

    def _call_for_inference(self, x):
        if self._call_has_training_arg:
            return self(x, training=False)
        return self(x)

    # ------------------------------------------------------------------
    # One execution: a list of batches in, the steps' results out.

    def make_train_function(self, force=False):
        raise NotImplementedError(TRAINING_NOT_AVAILABLE.format(method="fit"))

    def make_test_function(self, force=False):
        if self.test_function is not None and not force:
            return self.test_function

        def run_test_execution(batches):
            logs = {}
            for batch in batches:
                logs = self.test_step(batch)
            return logs

        self.test_function = run_test_execution
        return self.test_function

    def make_predict_function(self, force=False):
        if self.predict_function is not None and not force:
            return self.predict_function

        def run_predict_execution(batches):
            return _concatenate_steps(
                [_to_host(self.predict_step(batch)) for batch in batches]
            )

        self.predict_function = run_predict_execution
        return self.predict_function

    # ------------------------------------------------------------------
    # The loops

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
        raise NotImplementedError(TRAINING_NOT_AVAILABLE.format(method="fit"))

    def train_on_batch(
        self,
        x,
        y=None,
        sample_weight=None,
        class_weight=None,
        return_dict=False,
    ):
        raise NotImplementedError(
            TRAINING_NOT_AVAILABLE.format(method="train_on_batch")
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
            epoch_iterator = IPUEpochIterator(
                x=x,
                y=y,
                sample_weight=sample_weight,
                batch_size=batch_size,
                steps_per_epoch=steps,
                shuffle=False,
                steps_per_execution=self.steps_per_execution,
            )

        if not isinstance(callbacks, callbacks_module.CallbackList):
            callbacks = callbacks_module.CallbackList(
                callbacks,
                add_progbar=verbose != 0,
                verbose=verbose,
                epochs=1,
                steps=epoch_iterator.num_batches,
                model=self,
            )

        self.make_test_function()
        self.stop_evaluating = False
        callbacks.on_test_begin()
        logs = {}
        self.reset_metrics()
        built = False
        for begin_step, end_step, batches in epoch_iterator:
            if not built:
                # Built from the first batch of the loop itself: pulling
                # one ahead would lose it for a one-shot generator.
                self._symbolic_build(data_batch=batches[0])
                built = True
            callbacks.on_test_batch_begin(begin_step)
            logs = self.test_function(batches)
            callbacks.on_test_batch_end(end_step, logs)
            if self.stop_evaluating:
                break
        logs = pythonify_logs(self._get_metrics_result_or_logs(logs))
        callbacks.on_test_end(logs)

        if return_dict:
            return logs
        return self._flatten_metrics_in_order(logs)

    @traceback_utils.filter_traceback
    def predict(
        self, x, batch_size=None, verbose="auto", steps=None, callbacks=None
    ):
        epoch_iterator = IPUEpochIterator(
            x=x,
            batch_size=batch_size,
            steps_per_epoch=steps,
            shuffle=False,
            steps_per_execution=self.steps_per_execution,
        )

        if not isinstance(callbacks, callbacks_module.CallbackList):
            callbacks = callbacks_module.CallbackList(
                callbacks,
                add_progbar=verbose != 0,
                verbose=verbose,
                epochs=1,
                steps=epoch_iterator.num_batches,
                model=self,
            )

        self.make_predict_function()
        self.stop_predicting = False
        callbacks.on_predict_begin()
        # An unbuilt model builds during its first eager call.
        collected = None
        batch_outputs = None
        for begin_step, end_step, batches in epoch_iterator:
            callbacks.on_predict_batch_begin(begin_step)
            batch_outputs = self.predict_function(batches)
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
            if self.stop_predicting:
                break
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

    def test_on_batch(
        self,
        x,
        y=None,
        sample_weight=None,
        return_dict=False,
    ):
        self._assert_compile_called("test_on_batch")
        data = (x, y, sample_weight)
        self._symbolic_build(data_batch=data)
        self.make_test_function()
        self.reset_metrics()
        logs = pythonify_logs(self.test_function([data]))
        if return_dict:
            return logs
        return self._flatten_metrics_in_order(logs)

    def predict_on_batch(self, x):
        self.make_predict_function()
        return self.predict_function([(x,)])

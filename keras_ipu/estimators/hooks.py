"""Session-run hooks for estimators whose steps run on the IPU.

There is no TF1 session: the estimator calls each hook's `begin()`, then
`before_run(run_context)` / `after_run(run_context, run_values)` once per
loop (`iterations_per_loop` steps, one executable run, as Graphcore's
IPUEstimator does), then `end(None)`. `run_context.request_stop()` stops
training after the loop. A hook cannot fetch tensors from a session
(`before_run` returning fetches is an error saying so): values computed on
the IPU reach the host through an outfeed, which is what
`IPULoggingTensorHook.log` builds.
"""

import time

from absl import logging

from keras_ipu.ipu_outfeed_queue import IPUOutfeedMode


class RunContext:
    """The `run_context` handed to hooks (tf.compat.v1.train.SessionRunContext's
    interface without a session)."""

    def __init__(self, global_step, iterations):
        self.global_step = global_step  # after the loop
        self.iterations = iterations  # steps the loop ran
        self.session = None
        self.original_args = None
        self._stop_requested = False

    def request_stop(self):
        self._stop_requested = True

    @property
    def stop_requested(self):
        return self._stop_requested


class RunValues:
    def __init__(self):
        self.results = None
        self.options = None
        self.run_metadata = None


def call_before_run(hooks, context):
    for hook in hooks:
        requested = hook.before_run(context)
        fetches = getattr(requested, "fetches", None)
        if fetches:
            raise NotImplementedError(
                f"{type(hook).__name__}.before_run asked to fetch {fetches!r}: the "
                "estimator's steps run on the IPU with no TF1 session to fetch "
                "tensors from. Log tensors with ipu_session_run_hooks."
                "IPULoggingTensorHook (hook.log(tensors) in the model_fn).")


def call_after_run(hooks, context):
    for hook in hooks:
        hook.after_run(context, RunValues())


class IPULoggingTensorHook:
    """Prints the given tensors every N local steps, every N seconds, or at
    the end, taking them off the IPU through an outfeed.

    In the model_fn, `log_op = hook.log({"loss": loss})` enqueues the
    tensors (make the train op depend on it, e.g. `tf.group(train_op,
    log_op)`); pass the hook in the spec's training_hooks (or to train).

    Args:
      every_n_iter: print every N local steps (at most once per loop).
      every_n_secs: print every N seconds.
      at_end: print at the end of the run.
      formatter: a function of the dict of values returning the string to
        print.
      logging_mode: IPUOutfeedMode.LAST (the last step of the loop) or ALL
        (the values of every step of the loop).
    """

    LoggingMode = IPUOutfeedMode

    def __init__(self, every_n_iter=None, every_n_secs=None, at_end=False, formatter=None,
                 logging_mode=IPUOutfeedMode.LAST):
        only_log_at_end = at_end and every_n_iter is None and every_n_secs is None
        if not only_log_at_end and (every_n_iter is None) == (every_n_secs is None):
            raise ValueError(
                "Either every_n_iter or every_n_secs must be specified, but not both "
                "(or at_end=True alone).")
        if every_n_iter is not None and every_n_iter <= 0:
            raise ValueError(f"invalid every_n_iter={every_n_iter}.")
        self._every_n_iter = every_n_iter
        self._every_n_secs = every_n_secs
        self._at_end = at_end
        self._formatter = formatter
        self._mode = logging_mode
        self._outfeed = None
        self._last_step = None
        self._last_time = None
        self._latest = None
        self.logged = []  # (local step, values) of each print, for inspection

    def log(self, tensors):
        """The op that sends `tensors` (a dict, a list, or one tensor) to the
        host; call it in the model_fn."""
        from keras_ipu.ipu_outfeed_queue import IPUOutfeedQueue

        if self._outfeed is None:
            self._outfeed = IPUOutfeedQueue(outfeed_mode=self._mode)
        return self._outfeed.enqueue(tensors if isinstance(tensors, dict)
                                     else {"tensors": tensors})

    def begin(self):
        self._local_step = 0
        self._last_step = None
        self._last_time = None

    def after_create_session(self, session, coord):
        pass

    def before_run(self, run_context):
        return None

    def after_run(self, run_context, run_values):
        if self._outfeed is None:
            raise ValueError(
                "IPULoggingTensorHook: log() was not called in the model_fn, so "
                "there are no tensors to print.")
        self._latest = self._outfeed.dequeue()
        self._local_step += run_context.iterations
        if self._due():
            self._print()

    def _due(self):
        now = time.time()
        if self._every_n_iter is not None:
            if self._last_step is None or self._local_step - self._last_step >= self._every_n_iter:
                self._last_step = self._local_step
                return True
            return False
        if self._every_n_secs is not None:
            if self._last_time is None or now - self._last_time >= self._every_n_secs:
                self._last_time = now
                return True
        return False

    def _print(self):
        values = {k: v.numpy() for k, v in self._latest.items()}
        self.logged.append((self._local_step, values))
        if self._formatter is not None:
            logging.info(self._formatter(values))
        else:
            logging.info(", ".join(f"{k} = {v}" for k, v in values.items()))

    def end(self, session):
        if self._at_end and self._latest is not None:
            self._print()

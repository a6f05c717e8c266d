"""TensorFlow's profiler sees the IPU: programs of the TensorFlow front end
in the profile TensorFlow writes.

A TensorFlow user profiles with TensorFlow's own profiler:
`tf.profiler.experimental.start(logdir)` / `stop()`, the `Profile` context
manager, or `TensorBoard(profile_batch=...)` under KERAS_BACKEND=tensorflow
(Keras calls `tf.profiler.experimental.start`). TensorFlow knows nothing of
the simulated IPU, so its `<host>.xplane.pb` would hold the host alone.
While such a session runs, keras_ipu records every executable run (as for
the ipu backend's TensorBoard trace, keras_ipu/backend/tensorboard.py); when
it stops and TensorFlow has written its XSpace, the IPU planes (the
predicted timeline, memory counters and memory activity of
report/xspace.py) are merged into that same file, on TensorFlow's clock,
and the trace JSON and the predicted scalars are written beside it, as for
a Keras fit under the ipu backend.

The import hook (_hook.py) calls `wrap(module)` right after TensorFlow's
`tensorflow.python.profiler.profiler_v2` is imported, before anything can
bind its `start` / `stop` (`tf.profiler.experimental.start` is the same
function object); KERAS_IPU_TF_HOOK=0 turns it off. This module imports
nothing at its top: it runs while TensorFlow is being imported.
"""

import functools
import time

_WRAPPED = "_keras_ipu_profiler"


def wrap(module):
    """Makes `module.start` / `module.stop` (TensorFlow's profiler_v2) also
    start and stop keras_ipu's recording of executable runs."""
    start, stop = module.start, module.stop
    if getattr(start, _WRAPPED, False):
        return

    @functools.wraps(start)
    def start_and_record(logdir, options=None):
        start(logdir, options)
        on_start(logdir)

    @functools.wraps(stop)
    def stop_and_merge(save=True):
        began = time.time()
        try:
            stop(save)
        except BaseException:
            on_stop(False, began)
            raise
        on_stop(save, began)

    setattr(start_and_record, _WRAPPED, True)
    setattr(stop_and_merge, _WRAPPED, True)
    module.start, module.stop = start_and_record, stop_and_merge


_recording = None  # the keras_ipu trace this module started, if any


def on_start(logdir):
    """TensorFlow's profiler has started: record keras_ipu's runs too. (A
    keras_ipu trace already running, the ipu backend's TensorBoard, keeps
    recording them; nothing more is started.)"""
    global _recording
    from keras_ipu.backend import tensorboard

    try:
        _recording = tensorboard.start_trace(str(logdir or ""))
    except RuntimeError:  # another keras_ipu trace owns the runs
        _recording = None


def on_stop(save, began):
    """TensorFlow's profiler has stopped (and, with `save`, written its
    XSpace): merge the IPU planes of the runs recorded into it."""
    global _recording
    recording, _recording = _recording, None
    if recording is None:
        return None
    from keras_ipu.backend import tensorboard

    trace = tensorboard.take_trace(recording)
    if trace is None or not (save and trace.logdir and trace.runs):
        return None
    run_dir = tensorflow_run_directory(trace.logdir, began)
    if run_dir is None:
        import warnings

        warnings.warn(
            f"TensorFlow's profiler wrote no profile under {trace.logdir!r}: the "
            "IPU planes of this session are written into a run directory of "
            "their own.", RuntimeWarning, stacklevel=3)
    return tensorboard.save_trace(trace, tensorflow_dir=run_dir)


def tensorflow_run_directory(logdir, since):
    """The run directory (`<logdir>/plugins/profile/<run>`) whose XSpace
    TensorFlow's profiler wrote at or after `since` (time.time() seconds),
    the newest; None if there is none."""
    import glob
    import os

    found = []
    for path in glob.glob(os.path.join(glob.escape(str(logdir)), "plugins", "profile",
                                       "*", "*.xplane.pb")):
        try:
            mtime = os.path.getmtime(path)
        except OSError:
            continue
        if mtime >= since - 1.0:  # file systems keep coarse times
            found.append((mtime, os.path.dirname(path)))
    return max(found)[1] if found else None

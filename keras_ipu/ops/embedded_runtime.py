"""keras_ipu.ops.embedded_runtime: the embedded application runtime
(Graphcore's `tensorflow.python.ipu.ops.embedded_runtime`, also
`keras_ipu.embedded_runtime`): run an executable file written by
application_compile_op from TensorFlow code.

As Graphcore's runtime, `embedded_runtime_start` loads the program and
starts an engine that runs it again and again in its own thread, with
the start inputs as its parameters (variables keep the values each run
writes, on the device). Each `embedded_runtime_call` hands one element
to the program's infeeds and returns what the program sent to its
outfeeds for that element: a program looping over n infeed elements
serves n calls per run. The engine thread waits for calls; it ends when
its RuntimeContext is garbage collected (Graphcore's runtime cannot be
stopped: embedded_runtime_stop raises, as theirs).
"""

import collections
import queue
import threading
import weakref

import numpy as np

from keras_ipu.device import host_streams
from keras_ipu.ops import application_file


class _Stopped(Exception):
    """The context was dropped while the engine waited for a call."""


class _InfeedStream:
    def __init__(self, engine, offset):
        self.engine, self.offset = engine, offset

    def receive(self, component, shape, dtype):
        return self.engine.receive(self.offset + component)


class _OutfeedStream:
    def __init__(self, engine, offset):
        self.engine, self.offset = engine, offset

    def send(self, component, value):
        self.engine.send(self.offset + component, value)


class _Engine:
    """The program run in a loop by a thread, fed by calls."""

    # How often a waiting engine looks whether its context is gone (seconds).
    _POLL = 0.5

    def __init__(self, application, start_values, name):
        self.app = application
        self.name = name
        self._pending = collections.deque()  # call elements not read by the program yet
        self._slots = [collections.deque() for _ in application.streamed_inputs]
        # Per outfeed component, the values sent: one of each makes a call's
        # outputs. A program may send before it reads (nothing orders an
        # outfeed of a variable after the infeed), so outputs are matched
        # to calls by order, as Graphcore's outfeed queue does.
        self._sent = [collections.deque() for _ in application.streamed_outputs]
        self._results = queue.Queue()
        self._cond = threading.Condition()
        self._call_lock = threading.Lock()  # one call's input, then its outputs
        self._closed = False
        self.error = None
        streams = {}
        offset = 0
        for s in application.infeeds:
            streams[s.stream_id] = _InfeedStream(self, offset)
            offset += len(s.components)
        offset = 0
        for s in application.outfeeds:
            streams[s.stream_id] = _OutfeedStream(self, offset)
            offset += len(s.components)
        feed = []
        for kind, value in application.feed:
            feed.append(start_values[value] if kind == "input" else value)
        if application.uses_token:
            feed.append(np.zeros((), np.uint32))
        self._feed = feed
        self._thread = threading.Thread(
            target=self._serve, args=(streams,), name=f"embedded_runtime {name}", daemon=True)
        self._thread.start()

    # -- caller side --------------------------------------------------------

    def call(self, values):
        with self._call_lock:
            with self._cond:
                if self.error is not None:
                    raise self.error
                self._pending.append(values)
                self._cond.notify_all()
            result = self._results.get()
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- engine side --------------------------------------------------------

    def _wait_for_call(self):
        with self._cond:
            while not self._pending:
                if self._closed:
                    raise _Stopped
                self._cond.wait(self._POLL)

    def receive(self, slot):
        if not self._slots[slot]:
            self._wait_for_call()
            with self._cond:
                values = self._pending.popleft()
            for queue_, value in zip(self._slots, values):
                queue_.append(value)
            if not self._sent:  # a program with no outfeed answers on reading
                self._results.put([])
        return self._slots[slot].popleft()

    def send(self, slot, value):
        self._sent[slot].append(value)
        if all(self._sent):
            self._results.put([q.popleft() for q in self._sent])

    def _serve(self, streams):
        exe = self.app.executable
        try:
            with host_streams.bound(streams):
                while True:
                    self._wait_for_call()
                    results = exe.run(*self._feed)
                    for out, param in self.app.updates:
                        self._feed[param] = results[out]
        except _Stopped:
            return
        except Exception as e:  # noqa: BLE001 - handed to the waiting caller
            with self._cond:
                self.error = e
                self._pending.clear()
            self._results.put(e)


def _check(values, signature, error=ValueError):
    for i, (value, spec) in enumerate(zip(values, signature)):
        shape = list(np.shape(value))
        if shape != list(spec.shape):
            raise ValueError(
                f"Mismatched input shape at position {i} ('{spec.name}'). Expected "
                f"{list(spec.shape)}, but input {i} has shape {shape}.")
        dtype = np.asarray(value).dtype
        if dtype != spec.dtype:
            raise error(
                f"Mismatched input dtype at position {i} ('{spec.name}'). Expected "
                f"{spec.dtype.name}, but input {i} has dtype {dtype.name}.")


def _arrays(values):
    return [np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in values]


class RuntimeContext:
    """Represents an instance of the application runtime.

    This class must not be constructed directly, instead call
    `embedded_runtime_start` or `embedded_runtime_start_and_call`.
    """

    def __init__(self, name, executable_file, executable_proto, start_output):
        self._name = name
        self._executable_file = executable_file
        self._application = executable_proto
        self._engine = start_output
        weakref.finalize(self, start_output.close)

    def name(self):
        """The name of the application runtime instance."""
        return self._name

    def signature(self):
        """The signature of the executable: an Application
        (application_file.py) with `inputs`, `streamed_inputs` and
        `streamed_outputs` (TensorSignature name, shape, dtype each)."""
        return self._application

    def output_types(self):
        """The output dtypes of the executable (TensorFlow dtypes)."""
        import tensorflow as tf

        return [tf.as_dtype(s.dtype) for s in self._application.streamed_outputs]

    def start_output(self):
        """The running engine started for this instance."""
        return self._engine


def _require_eager(what):
    import tensorflow as tf

    if not tf.executing_eagerly():
        raise NotImplementedError(
            f"{what} runs eagerly here: the simulated engine is driven from "
            "Python, not from a TensorFlow graph op. Call it outside tf.function.")


def embedded_runtime_start(executable_file, inputs, name, timeout=None):
    """Create and start an application runtime from an executable file.

    Args:
      executable_file: The path to the executable file (string or Tensor).
      inputs: The initial input tensors (a list, or a dict by input name).
      name: The name of the application runtime instance.
      timeout: Graphcore's wait for a pipelined model's next batch
        (microseconds). Accepted and not needed: the simulated engine runs
        a program only when a call has given it data.

    Returns:
      An embedded application runtime context instance.
    """
    _require_eager("embedded_runtime_start")
    if hasattr(executable_file, "numpy"):
        executable_file = executable_file.numpy()
    if isinstance(executable_file, bytes):
        executable_file = executable_file.decode()
    app = application_file.read(executable_file)
    if app.replication_factor != 1:
        # Graphcore's runtime checks the same before it loads the engine.
        raise NotImplementedError(
            "Embedded runtime does not support executables with a replication factor "
            f"greater than one (this one has {app.replication_factor}: the configured "
            "device has that many times the program's IPUs). Compile it with "
            "IPUConfig.auto_select_ipus set to the program's own IPUs.")
    if isinstance(inputs, dict):
        missing = [s.name for s in app.inputs if s.name not in inputs]
        if missing:
            raise ValueError(
                f"Failed to find input tensor with name '{missing[0]}' in input "
                "dictionary.")
        inputs = [inputs[s.name] for s in app.inputs]
    if isinstance(inputs, tuple):
        inputs = list(inputs)
    if not isinstance(inputs, list):
        raise TypeError("Expected the inputs to be a list.")
    if len(inputs) != len(app.inputs):
        raise ValueError(
            f"Embedded application runtime expects {len(app.inputs)} inputs, "
            f"but {len(inputs)} were provided.")
    values = _arrays(inputs)
    _check(values, app.inputs)
    return RuntimeContext(name, executable_file, app, _Engine(app, values, name))


def embedded_runtime_call(inputs, context):
    """Call an application with a batch of input data.

    Args:
      inputs: A batch of data to pass to the application (one element of
        its infeeds, their components in order).
      context: The application runtime context created with
        `embedded_runtime_start`.

    Returns:
      The output tensors from the application (its outfeeds' components).
    """
    import tensorflow as tf

    _require_eager("embedded_runtime_call")
    streamed = context.signature().streamed_inputs
    if len(inputs) != len(streamed):
        raise ValueError(
            f"Embedded application call expects {len(streamed)} inputs, but "
            f"{len(inputs)} were provided.")
    values = _arrays(inputs)
    _check(values, streamed, error=TypeError)
    outputs = context.start_output().call(values)
    return [tf.convert_to_tensor(v) for v in outputs]


def embedded_runtime_stop(context):  # noqa: ARG001 - Graphcore's signature
    """Stop an application runtime (not supported, as in Graphcore's SDK)."""
    raise NotImplementedError("Embedded runtime doesn't support stopping an engine.")


def embedded_runtime_start_and_call(executable_file, startup_inputs, call_inputs, name):
    """Create and start an application runtime and call it once.

    Returns:
      A tuple of the batch results and the embedded application runtime
      context.
    """
    context = embedded_runtime_start(executable_file, startup_inputs, name)
    return embedded_runtime_call(call_inputs, context), context

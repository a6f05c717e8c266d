"""Graphcore's `internal_ops.print_tensor`: a tensor printed to standard
error by the host each time the compiled program reaches it.

On the IPU, Poplar's PrintTensor copies the tensor to the host through a
data stream, and the host prints it. Here the same: the TensorFlow
function emits an XLA custom call with a side effect (kept by XLA,
ordered with the program's other host transfers), which the front end
imports as a send on a host data stream (device/primitives/host_transfer:
stream_to_host, costed as the PCIe transfer of the tensor's bytes) whose
host side writes "name: values" to sys.stderr when the simulator runs it.
A replicated program prints once per replica.
"""

import sys
import threading

import numpy as np

from keras_ipu.ops import xla_custom_call

TARGET = "KerasIpuPrintTensor"


class _PrintStream:
    """The host side of one tensor name's prints."""

    def __init__(self, name):
        self.name = name

    def receive(self, component, shape, dtype):
        raise TypeError(f"print_tensor {self.name!r} only sends to the host.")

    def send(self, component, value):
        text = np.array2string(np.asarray(value), separator=", ", threshold=sys.maxsize)
        line = (f"{self.name}: {text}" if self.name else text) + "\n"
        # Replicas run in threads: one write per line under a lock, or their
        # lines interleave (print writes the text and the newline apart).
        with _write_lock:
            sys.stderr.write(line)
            sys.stderr.flush()


# Streams live as long as the process: a compiled program keeps the id of
# its stream (host_streams holds streams weakly).
_streams = {}
_lock = threading.Lock()
_write_lock = threading.Lock()


def stream_id(name):
    from keras_ipu.device import host_streams

    with _lock:
        entry = _streams.get(name)
        if entry is None:
            stream = _PrintStream(name)
            entry = _streams[name] = (stream, host_streams.register(stream))
    return entry[1]


@xla_custom_call.import_rule(TARGET)
def _import(imp, instr, operands, config):
    from keras_ipu.device.primitives.host_transfer import stream_to_host_p
    from keras_ipu.frontends.tensorflow.opcodes.effects import bind_effect

    (x,) = operands
    bind_effect(imp, stream_to_host_p, imp.array(x), stream=stream_id(config["name"]),
            component=0)
    return x


def print_tensor(x, name):
    """`x` unchanged, after a print of it (see the module doc)."""
    import tensorflow as tf

    @tf.custom_gradient
    def printed(t):
        (out,) = xla_custom_call.emit(TARGET, [t], [t.dtype], [t.shape], {"name": name},
                                      has_side_effect=True)
        # Gradients pass through the print, as Graphcore's.
        return out, lambda dy: dy

    return printed(tf.convert_to_tensor(x))

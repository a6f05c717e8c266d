"""keras_ipu.ops.application_compile_op: Compiling a function into an
executable file (Graphcore's `tensorflow.python.ipu.ops.application_compile_op`,
also `keras_ipu.application_compile_op`).

The function is traced and compiled through the TensorFlow front end, as
ipu_compiler.compile does, for the configured IPU system; instead of
running, the program is written to a file (application_file.py) that
embedded_runtime runs from TensorFlow code. Its infeeds' elements become
the inputs of each runtime call and its outfeeds' values the call's
outputs; the function's arguments and (unless frozen) the variables it
reads are the runtime's start inputs.
"""

import os
import tempfile

import numpy as np

from keras_ipu.device import host_streams
from keras_ipu.device.config import system_config
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.simulator.system import rounded_shards
from keras_ipu.ops import application_file
from keras_ipu.ops import program_state


def _nodes(graph):
    for node in graph.nodes:
        yield node
        for inner in subgraphs(node):
            yield from _nodes(inner)


def _streams(graph, primitive):
    from keras_ipu.frontends.tensorflow import feeds

    """The Streams the program reads (stream_from_host) or writes
    (stream_to_host), in the order the program first uses them."""
    found = {}
    for node in _nodes(graph):
        if node.primitive.name != primitive:
            continue
        p = node.params
        if primitive == "stream_from_host":
            shape, dtype = tuple(p["shape"]), np.dtype(p["dtype"])
        else:
            shape, dtype = tuple(node.inputs[1].aval.shape), np.dtype(node.inputs[1].aval.dtype)
        queue = host_streams.get(p["stream"])
        if not isinstance(queue, (feeds.Infeed, feeds.Outfeed)):
            raise NotImplementedError(
                f"The function uses the host stream of {type(queue).__name__} "
                "(print_tensor or a host embedding); an application executable "
                "here carries only infeeds and outfeeds, whose host side the "
                "embedded runtime serves. Remove it from the compiled function.")
        name = f"{getattr(queue, 'name', 'stream')}_{p['component']}"
        found.setdefault(p["stream"], {})[p["component"]] = application_file.TensorSignature(
            name, shape, dtype)
    return tuple(
        application_file.Stream(sid, tuple(parts[c] for c in sorted(parts)))
        for sid, parts in found.items())


def _application(func, inputs, freeze_variables):
    import tensorflow as tf

    from keras_ipu.frontends.tensorflow.function import bridge
    from keras_ipu.ipu_compiler import _postprocess

    def run(args):
        # ipu_compiler.compile's conventions for what `func` returns.
        return _postprocess(func(*args))

    run.__name__ = getattr(func, "__name__", "application")
    bridged = bridge(tf.function(run, jit_compile=True, autograph=False))
    args = tf.nest.map_structure(tf.convert_to_tensor, inputs)
    cf, all_inputs, arrays, program = bridged.program((args,))
    executable = bridged.executable(program)
    # As Graphcore's compiler, the device's IPUs over the program's shards
    # make its replication factor; the file records it and the runtime
    # refuses a replicated program, as Graphcore's does.
    replicas = system_config.current_system().device(0).replication_factor(
        rounded_shards(max(executable.ipus) + 1))
    if replicas > 1:
        cf, all_inputs, arrays, program = bridged.program((args,), replicas=replicas)
        executable = bridged.executable(program)
    captured = program.trace.captured
    n_flat = len(all_inputs) - captured.n
    variables = {id(v.handle): v for v in cf.variables}
    signature, feed, updates = [], [], []
    for param, i in enumerate(program.param_inputs):
        variable = variables.get(id(all_inputs[i]))
        # Captured tensors are constants of the trace; captured variables
        # are inputs unless frozen; the program's own state (accumulators,
        # FIFOs) starts from its value now and, as every variable the
        # program writes, keeps what each run writes.
        frozen = i >= n_flat and (freeze_variables or (i - n_flat) not in captured.resources
                                  or program_state.is_program_state(variable))
        if frozen:
            feed.append(("value", np.asarray(arrays[i])))
            continue
        # Arguments by position, variables by their names (start inputs
        # can be given as a dict of these names).
        name = f"input_{i}" if variable is None else variable.name
        feed.append(("input", len(signature)))
        signature.append(application_file.TensorSignature(
            name, tuple(np.shape(arrays[i])), np.asarray(arrays[i]).dtype))
    for out, i in program.updates:
        updates.append((out, program.param_inputs.index(i)))
    return application_file.Application(
        executable=executable, replication_factor=replicas, inputs=tuple(signature),
        feed=tuple(feed),
        uses_token=program.uses_token, updates=tuple(updates),
        infeeds=_streams(program.graph, "stream_from_host"),
        outfeeds=_streams(program.graph, "stream_to_host"))


def experimental_application_compile_op(func, inputs=None, output_path=None,
                                        freeze_variables=False, name=None):
    """Compiles `func(*inputs)` into an executable for the IPU and writes it
    to a file.

    Args:
      func: The Python function to compile.
      inputs: The inputs passed to the function, as func(*inputs).
      output_path: The path where the executable will be stored. If None, a
        temporary file is used.
      freeze_variables: If True, the variables the function reads are
        stored in the executable with their current values. If False, they
        are start inputs of the runtime (after the function's arguments).
      name: Optional op name (unused: the compilation runs now, eagerly).

    Returns:
      A string Tensor: the path of the executable file.
    """
    import tensorflow as tf

    if not tf.executing_eagerly():
        raise NotImplementedError(
            "experimental_application_compile_op compiles when it is called, "
            "eagerly; it cannot be an op of a TensorFlow graph here (there is "
            "no TF1 session to run it in). Call it outside tf.function.")
    application = _application(func, list(inputs or []), freeze_variables)
    if output_path is None:
        fd, output_path = tempfile.mkstemp(suffix=application_file.SUFFIX)
        os.close(fd)
    application_file.write(os.fspath(output_path), application)
    return tf.constant(os.fspath(output_path))

"""Opcodes with side effects: host transfers (send/recv of the IPU infeed
and outfeed queues) and XLA's random number ops. Effects take and return
the importer's effect token (importer.py), which keeps them ordered.

Which host stream a send/recv talks to is written on the instruction by
the queue that made it, as XLA frontend attributes (feeds.py sets them on
the TensorFlow ops): `_keras_ipu_stream` (the stream's id in
keras_ipu.device.host_streams) and `_keras_ipu_component` (which leaf of
the queue's element structure).
"""

import numpy as np

from keras_ipu.device.primitives import host_transfer
from keras_ipu.device.primitives import xla_random
from keras_ipu.frontends.tensorflow import hlo_proto
from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import TOKEN
from keras_ipu.frontends.tensorflow.importer import rule
from keras_ipu.frontends.tensorflow.opcodes.shapes import scalar_index

STREAM_ATTRIBUTE = "_keras_ipu_stream"
COMPONENT_ATTRIBUTE = "_keras_ipu_component"


def _stream_of(instr, what):
    attrs = instr.frontend_attributes.map
    if STREAM_ATTRIBUTE not in attrs:
        raise HloImportError(
            f"{what} on channel {instr.channel_id} does not belong to an IPU "
            "infeed or outfeed queue. Host transfers in a compiled function go "
            "through ipu_infeed_queue.IPUInfeedQueue / "
            "ipu_outfeed_queue.IPUOutfeedQueue (or a dataset iterator passed "
            "to IPUStrategy.run)."
        )
    return int(attrs[STREAM_ATTRIBUTE]), int(attrs.get(COMPONENT_ATTRIBUTE, "0"))


def bind_effect(imp, prim, *args, **params):
    """Bind an effectful primitive with the current token (recorded, never
    run at import time) and advance the token."""
    from keras_ipu.device.trace import current_builder

    if imp.token is None:
        raise HloImportError("an effect outside the program's effect order (internal error).")
    args = [imp.raw(a) for a in args]
    out = prim.bind_traced(current_builder(), imp.token, *args, **params)
    if prim.multiple_results:
        imp.token, *rest = out
        return rest
    imp.token = out
    return []


@rule("recv")
def _recv(imp, instr, operands):
    stream, component = _stream_of(instr, "an HLO recv")
    data_shape = instr.shape.tuple_shapes[0]
    dims, dtype = hlo_proto.array_shape(data_shape)
    (value,) = bind_effect(imp, host_transfer.stream_from_host_p, stream=stream,
                       component=component, shape=dims, dtype=dtype)
    return (value, np.zeros((), np.uint32), TOKEN)


@rule("recv-done")
def _recv_done(imp, instr, operands):
    (started,) = operands
    return (started[0], TOKEN)


@rule("send")
def _send(imp, instr, operands):
    value, _token = operands
    stream, component = _stream_of(instr, "an HLO send")
    bind_effect(imp, host_transfer.stream_to_host_p, imp.array(value), stream=stream,
            component=component)
    return (value, np.zeros((), np.uint32), TOKEN)


@rule("send-done")
def _send_done(imp, instr, operands):
    return TOKEN


@rule("rng-bit-generator")
def _rng_bit_generator(imp, instr, operands):
    (state,) = operands
    _, xla_data_pb2 = hlo_proto.protos()
    name = xla_data_pb2.RandomAlgorithm.Name(instr.rng_algorithm)
    # XLA's CPU backend expands RNG_DEFAULT to Philox.
    algorithm = {"RNG_PHILOX": "philox", "RNG_DEFAULT": "philox",
                 "RNG_THREE_FRY": "three_fry"}.get(name)
    if algorithm is None:
        raise HloImportError(f"random algorithm {name} is not supported.")
    dims, dtype = hlo_proto.array_shape(instr.shape.tuple_shapes[1])
    new_state, bits = imp.bind(xla_random.rng_bit_generator_p, imp.array(state),
                               algorithm=algorithm, shape=dims, dtype=dtype)
    return (new_state, bits)


@rule("rng")
def _rng(imp, instr, operands):
    a, b = (scalar_index(imp, x) for x in operands)
    _, xla_data_pb2 = hlo_proto.protos()
    name = xla_data_pb2.RandomDistribution.Name(instr.distribution)
    distribution = {"RNG_UNIFORM": "uniform", "RNG_NORMAL": "normal"}.get(name)
    if distribution is None:
        raise HloImportError(f"random distribution {name} is not supported.")
    dims, _ = hlo_proto.array_shape(instr.shape)
    (values,) = bind_effect(imp, xla_random.rng_stateful_p, a, b,
                        distribution=distribution, shape=dims)
    return values

"""tensorflow.python.ipu.scopes: scoping contexts for TensorFlow code
compiled for the IPU.

Scopes mark TensorFlow ops with XLA frontend attributes, which TensorFlow
copies onto the HLO instructions the ops lower to and the front end reads
(keras_ipu/frontends/tensorflow/attributes.py). `outside_compilation_scope`
is the one the simulator acts on: its ops run on the host, their inputs and
outputs cross the host link (the transfer time is part of the predicted
cycles). The ops inside must still have XLA kernels on the CPU (TensorFlow
lowers the whole function to HLO before the front end splits it).
"""

import contextlib

import numpy as np

from keras_ipu.frontends.tensorflow.attributes import OUTSIDE_COMPILATION
from keras_ipu.frontends.tensorflow.attributes import current_attributes
from keras_ipu.frontends.tensorflow.attributes import frontend_attributes

# Graphcore's backend_config FrontendAttributeId names.
STOCHASTIC_ROUNDING = "STOCHASTIC_ROUNDING"
PARTIALS_TYPE = "PARTIALS_TYPE"


@contextlib.contextmanager
def ipu_jit_scope(ipu_scope):
    """Provides a scope for compilation of operations. In TensorFlow 2 the
    function given to IPUStrategy.run (or ipu_compiler.compile) is the
    compilation unit, so the scope only names it."""
    yield


def _ipu_ordinal(device):
    text = str(device)
    prefix = "/device:IPU:"
    if not text.startswith(prefix) or not text[len(prefix):].isdigit():
        raise ValueError(
            f"ipu_scope needs an IPU device name such as '/device:IPU:0', got {device!r}.")
    return int(text[len(prefix):])


@contextlib.contextmanager
def ipu_scope(device):
    """Provides a scope for placing operations onto a particular IPU/IPU
    cluster ("/device:IPU:<n>"). TensorFlow itself knows no IPU device:
    what runs on the IPU is what ipu_compiler.compile or IPUStrategy.run
    compiles; the scope checks the device name and names the device."""
    ordinal = _ipu_ordinal(device)
    from keras_ipu.utils import get_num_of_ipus_in_device

    get_num_of_ipus_in_device(f"/device:IPU:{ordinal}")
    yield


@contextlib.contextmanager
def outside_compilation_scope(name="outside"):
    """Provides a scope for placing operations on the host, outside the
    current compilation scope (see the module doc)."""
    from tensorflow.python.framework import ops

    from keras_ipu.frontends.tensorflow.function import tracing_for_ipu

    if not tracing_for_ipu():
        raise ValueError("outside_compilation_scope is only allowed in XLA context")
    if OUTSIDE_COMPILATION in current_attributes():
        raise ValueError("Illegal nesting of outside_compilation_scope")
    graph = ops.get_default_graph()
    unique = graph.unique_name(name, mark_as_used=True)
    with ops.name_scope(unique), frontend_attributes({OUTSIDE_COMPILATION: unique}):
        yield


@contextlib.contextmanager
def ipu_shard(index):
    """Control sharding for a set of operations: the ops made inside carry
    XLA's maximal sharding on IPU `index` (the `_XlaSharding` attribute),
    which tf2xla copies onto their HLO; the front end's importer puts them
    on that shard and the program compiles placed, shard s on IPU s, with
    the copies between IPUs (an op with no mark runs where the values it
    reads are, as Graphcore's sharding pass places it)."""
    from tensorflow.compiler.xla import xla_data_pb2
    from tensorflow.core.framework import attr_value_pb2
    from tensorflow.python.framework import ops

    ipus = list(index) if hasattr(index, "__iter__") else [index]
    proto = xla_data_pb2.OpSharding(type=xla_data_pb2.OpSharding.MAXIMAL,
                                    tile_assignment_devices=ipus)
    attrs = {"_XlaSharding": attr_value_pb2.AttrValue(s=proto.SerializeToString())}
    with ops.get_default_graph()._attr_scope(attrs):  # noqa: SLF001 - TensorFlow's op attribute scope
        yield


@contextlib.contextmanager
def frontend_attribute(attribute_name, attribute_value, restore_to=None):
    """Sets the specified scope attribute to the specified value in the graph.

    Args:
      attribute_name: name of the attribute.
      attribute_value: the attribute's value as a string.
      restore_to: if at the end of the scope the attribute was to be
        undefined, it is set to this value instead.
    """
    restore = None if restore_to is None else {attribute_name: restore_to}
    with frontend_attributes({attribute_name: attribute_value}, restore_to=restore):
        yield


@contextlib.contextmanager
def stochastic_rounding(override):
    """Control stochastic rounding for a set of operations (EXPERIMENTAL, as
    in Graphcore's SDK: there are no guarantees it is used; the simulator
    applies the configured floating-point behaviour to the whole program)."""
    with frontend_attribute(STOCHASTIC_ROUNDING, "FORCE_ON" if override else "FORCE_OFF",
                            "NOT_SET"):
        yield


@contextlib.contextmanager
def partials_type(override_type):
    """Override the type of intermediate results of convolutions and
    matrix multiplications (EXPERIMENTAL: no guarantees it is used).

    Raises:
      ValueError: unless override_type is float16 or float32.
    """
    dtype = np.dtype(override_type)
    names = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    if dtype not in names:
        raise ValueError(f"Only support float16, float32, provided {dtype}")
    with frontend_attribute(PARTIALS_TYPE, names[dtype], "PRIMITIVE_TYPE_INVALID"):
        yield

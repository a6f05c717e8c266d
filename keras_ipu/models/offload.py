"""Which optimizer state a model's training keeps in Streaming Memory:
Graphcore's `offload_weight_update_variables` and
`replicated_optimizer_state_sharding` (set_pipelining_options,
set_gradient_accumulation_options, the SDK 2.1 classes' arguments), as
graphcore/tensorflow's VariablesOffloadAndPartition pass decides it
(cost_model [TFOFFLOAD]):

- only with a weight update separate from the micro-batches (gradient
  accumulation, or a pipeline): the variables read and written only by the
  weight update, that is the optimizer's state;
- True: offloaded; a system without remote buffers fails with Poplar's
  FailedPrecondition text; False: kept on the IPU; None (the default):
  offloaded where the system supports remote buffers, else kept;
- each variable at least IPUConfig.optimizations.minimum_remote_tensor_size
  bytes (times the replicas when sharded), so step counters stay;
- replicated_optimizer_state_sharding=True partitions each offloaded
  variable over the replicas; asking for it without offloading is Poplar's
  "not supported" error.

Remote buffers: IPUConfig.device_connection.enable_remote_buffers, or a
system whose IPUs sit in IPU-Machines with Streaming Memory (ipu2: the
IPU-M2000, ipu21: the Bow-2000 [BOW2000]); the ipu1 C2 cards have none.
(Graphcore's SDK asks the attached device; the simulated system answers
from its target.)
"""

import numpy as np

from keras_ipu.device.config import system_config
from keras_ipu.device.simulator.sharding import Offload

# IPU generations whose machines have Streaming Memory (cost_model [BOW2000]).
_STREAMING_MEMORY_TARGETS = ("ipu2", "ipu21")
_DEFAULT_MINIMUM_REMOTE_TENSOR_SIZE = 128  # IPUConfig's default

NO_REMOTE_MEMORY = (
    "Current configuration of the IPU devices does not support remote memory "
    "and therefore weight update only variables cannot be offloaded to remote "
    "memory.Consider configuring the IPU system with "
    "'IPUConfig.device_connection.enable_remote_buffers' set to True if remote "
    "memory is supported."
)


class FailedPreconditionError(RuntimeError):
    """Poplar's FailedPrecondition status, as the SDK raises it."""


def _ipu_config():
    system = system_config.configuration().system
    return getattr(system, "config", None) if system is not None else None


def remote_memory_supported():
    """Whether the configured system has remote buffers (module doc)."""
    config = _ipu_config()
    if config is not None and config.device_connection.enable_remote_buffers:
        return True
    return system_config.configuration().target.name in _STREAMING_MEMORY_TARGETS


def minimum_remote_tensor_size():
    config = _ipu_config()
    if config is None:
        return _DEFAULT_MINIMUM_REMOTE_TENSOR_SIZE
    return int(config.optimizations.minimum_remote_tensor_size)


def offload_options(model):
    """(offload_weight_update_variables, replicated_optimizer_state_sharding)
    as the model's options set them."""
    options = model._ipu_options
    if model._ipu_is_pipelined():
        kwargs = options.pipelining_kwargs
    else:
        kwargs = options.gradient_accumulation_optimizer_kwargs
    return (kwargs.get("offload_weight_update_variables"),
            kwargs.get("replicated_optimizer_state_sharding", False))


def offloaded_variables(model, replicas, gradient_accumulation):
    """(the optimizer variables kept in Streaming Memory, the replicas each
    is partitioned over) for `model` training with `gradient_accumulation`
    micro-batches per update over `replicas` replicas (module doc)."""
    offload, sharding = offload_options(model)
    if gradient_accumulation <= 1 and not model._ipu_is_pipelined():
        return [], 1  # no separate weight update: nothing is offloaded
    if sharding and offload is False:
        raise NotImplementedError(
            f"Requested replicated weight sharding for {model.name} without "
            "offloading. This is currently not supported."
        )
    if offload is False:
        return [], 1
    if not remote_memory_supported():
        if offload:
            raise FailedPreconditionError(NO_REMOTE_MEMORY)
        return [], 1
    shards = int(replicas) if sharding else 1
    smallest = minimum_remote_tensor_size() * shards
    chosen = [v for v in model.optimizer.variables
              if int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize >= smallest]
    return chosen, shards


def _offloaded_positions(model, state_variables, replicas, gradient_accumulation):
    """(positions among the flattened `state_variables` of those kept in
    Streaming Memory, the replicas each is partitioned over), or None."""
    chosen, shards = offloaded_variables(model, replicas, gradient_accumulation)
    if not chosen:
        return None
    ids = {id(v) for v in chosen}
    flat = [v for group in state_variables for v in group]
    return tuple(i for i, v in enumerate(flat) if id(v) in ids), shards


def program_offload(model, state_variables, replicas, gradient_accumulation):
    """The sharding.Offload of a training program whose inputs start with
    the flattened `state_variables` and whose outputs end with their new
    values, in the same order (the device loop's program, and
    prediction.trace_training_step's with device_loop); None when nothing
    is offloaded."""
    found = _offloaded_positions(model, state_variables, replicas, gradient_accumulation)
    if found is None:
        return None
    positions, shards = found
    n_state = sum(len(group) for group in state_variables)
    return Offload(inputs=positions, outputs=tuple(i - n_state for i in positions),
                   shards=shards)

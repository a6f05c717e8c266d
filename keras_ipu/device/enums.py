"""The configuration enums of `tensorflow.python.ipu.config`, same members:
the vocabulary the IPUConfig (config/) and the simulated system
(simulator/) share, below both.

The integer values follow the order in which the reference lists the members;
user code compares members, never values, and JSON stores member names.
"""

import enum


class DeviceConnectionType(enum.Enum):
    """When to attach to the (simulated) Poplar device.

    - ALWAYS: attach when the system is configured.
    - ON_DEMAND: attach when an executable first runs on the device.
    - PRE_COMPILE: never attach; executables compile (and are cached) and running
      them returns all zeros, for pre-compiling without IPUs.
    - NEVER: never attach; compiling works, running is an error.
    """

    ALWAYS = 0
    ON_DEMAND = 1
    PRE_COMPILE = 2
    NEVER = 3


class ExecutionProfileType(enum.Enum):
    """The detail of the execution profile (none, device, IPU or tile events)."""

    NO_PROFILE = 0
    DEVICE_PROFILE = 1
    IPU_PROFILE = 2
    TILE_PROFILE = 3


class MergeRemoteBuffersBehaviour(enum.Enum):
    """When compatible remote buffers are merged."""

    NO_MERGING = 0
    MERGE = 1
    IF_BENEFICIAL = 2


class SchedulingAlgorithm(enum.Enum):
    """The algorithm the instruction scheduler uses."""

    CHOOSE_BEST = 0
    CLUSTERING = 1
    POST_ORDER = 2
    LOOK_AHEAD = 3
    SHORTEST_PATH = 4


class SelectionOrder(enum.Enum):
    """How the shards of a multi-IPU device map to its IPUs.

    On the 16-IPU ladder (IPU 2k and 2k+1 side by side, 2k above 2k-2):
    - ZIGZAG: natural order 0, 1, 2, 3, ...
    - SNAKE: 0, 1, 3, 2, 4, 5, 7, 6, ... (each shard linked to the next)
    - HOOF: 0, 2, 4, ..., 14, 15, 13, ..., 1 (and the last linked to the first)
    - AUTO: chosen for the program (see simulator/system.py: shard_order).
    """

    AUTO = 0
    ZIGZAG = 1
    SNAKE = 2
    HOOF = 3


class StochasticRoundingBehaviour(enum.Enum):
    """OFF, ON, or ON only for the replica-identical parts of the graph."""

    OFF = 0
    ON = 1
    REPLICA_IDENTICAL_ONLY = 2


# Every enum of this module by name (the IPUConfig's option types name
# them): read from the module itself, so a new enum is declared in one place.
ENUMS = {
    name: value for name, value in list(globals().items())
    if isinstance(value, type) and issubclass(value, enum.Enum) and value.__module__ == __name__
}

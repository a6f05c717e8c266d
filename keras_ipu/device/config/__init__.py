"""IPUConfig, its enums and configure_ipu_system (public as keras_ipu.config)."""

from keras_ipu.device.config.ipu_config import IPUConfig, get_attribute_metadata
from keras_ipu.device.config.metadata import AttributeMetadata, IPUConfigDeprecationWarning
from keras_ipu.device.config.system_config import (
    configure_ipu_system,
    get_ipu_config,
    get_system,
    reset_ipu_configuration,
)
from keras_ipu.device.enums import (
    DeviceConnectionType,
    ExecutionProfileType,
    MergeRemoteBuffersBehaviour,
    SchedulingAlgorithm,
    SelectionOrder,
    StochasticRoundingBehaviour,
)

__all__ = [
    "AttributeMetadata",
    "DeviceConnectionType",
    "ExecutionProfileType",
    "IPUConfig",
    "IPUConfigDeprecationWarning",
    "MergeRemoteBuffersBehaviour",
    "SchedulingAlgorithm",
    "SelectionOrder",
    "StochasticRoundingBehaviour",
    "configure_ipu_system",
    "get_attribute_metadata",
    "get_ipu_config",
    "get_system",
    "reset_ipu_configuration",
]

"""keras_ipu.config: the configuration API of tensorflow.python.ipu.config."""

from keras_ipu.device.config import (  # noqa: F401
    AttributeMetadata,
    DeviceConnectionType,
    ExecutionProfileType,
    IPUConfig,
    MergeRemoteBuffersBehaviour,
    SchedulingAlgorithm,
    SelectionOrder,
    StochasticRoundingBehaviour,
    configure_ipu_system,
    get_attribute_metadata,
    get_ipu_config,
    reset_ipu_configuration,
)

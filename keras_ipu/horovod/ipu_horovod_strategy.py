"""The deprecated path of keras_ipu.distributed.ipu_horovod_strategy."""

from keras_ipu.distributed.ipu_horovod_strategy import IPUHorovodStrategy  # noqa: F401
from keras_ipu.distributed.ipu_horovod_strategy import IPUHorovodStrategyV1  # noqa: F401
from keras_ipu.distributed.ipu_horovod_strategy import IPUHorovodExtended  # noqa: F401

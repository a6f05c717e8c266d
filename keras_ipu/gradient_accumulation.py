"""keras_ipu.gradient_accumulation: Graphcore's
`tensorflow.python.ipu.gradient_accumulation`.

How the gradients of the `gradient_accumulation_count` micro-batches of an
optimizer step are combined before the weight update:

* SUM: their sum;
* MEAN: the sum of each scaled by 1 / count;
* RUNNING_MEAN: acc <- acc * n / (n + 1) + grad / (n + 1) for the n-th
  micro-batch (n from 0): the same mean, kept at the scale of one gradient
  while it accumulates (no float16 overflow).
"""

import enum
from enum import Enum  # noqa: F401 (in Graphcore's module namespace)


class GradientAccumulationReductionMethod(enum.Enum):
    SUM = 0
    MEAN = 1
    RUNNING_MEAN = 2

    @classmethod
    def parse(cls, reduction_method):
        if isinstance(reduction_method, cls):
            return reduction_method
        if isinstance(reduction_method, str):
            key = reduction_method.upper()
            if key in cls.__members__:
                return cls[key]
        raise ValueError(
            f"Cannot parse {reduction_method} as one of "
            "GradientAccumulationReductionMethod. Valid values are: "
            f"{', '.join(cls._member_names_)}."
        )

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

from keras_ipu._enum_names import ParsedByName


class GradientAccumulationReductionMethod(
        ParsedByName, enum.Enum,
        parse_error="Cannot parse {value} as one of GradientAccumulationReductionMethod. Valid "
                    "values are: {valid}."):
    SUM = 0
    MEAN = 1
    RUNNING_MEAN = 2

"""SGDIpuOptimizer: Keras' SGD with momentum, its momentum state in a
chosen precision."""

import keras
from keras import ops

from keras_ipu.optimizers.ipu_optimizer_base import IpuOptimizerBase
from keras_ipu.optimizers.ipu_optimizer_base import dtype_name


@keras.saving.register_keras_serializable(package="keras_ipu")
class SGDIpuOptimizer(keras.optimizers.SGD, IpuOptimizerBase):
    """Gradient descent with momentum (Nesterov's too), as Keras' SGD.

    Args:
      learning_rate, momentum, nesterov, name: as keras.optimizers.SGD.
      momentum_accum_dtype: the dtype of the momentum state (None: the
        weight's). The update is computed in optimizer_compute_precisions[0].
    """

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False,
                 name="SGD", momentum_accum_dtype=None, **kwargs):
        super().__init__(learning_rate=learning_rate, momentum=momentum,
                         nesterov=nesterov, name=name, **kwargs)
        self.momentum_accum_dtype = dtype_name(momentum_accum_dtype)

    def build(self, variables):
        if self.built:
            return
        IpuOptimizerBase.build(self, variables)
        self.momentums = []
        if self.momentum != 0:
            self.momentums = [self.add_state(v, "momentum", self.momentum_accum_dtype)
                              for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        if self.momentum == 0:
            lr = ops.cast(learning_rate, variable.dtype)
            self.assign_sub(variable, ops.multiply(ops.cast(gradient, variable.dtype), lr))
            return
        accum = self.momentums[self._get_variable_index(variable)]
        grad = self.compute(gradient)
        lr = self.compute(learning_rate)
        momentum = self.compute(self.momentum)
        # velocity = momentum * velocity - learning_rate * gradient
        velocity = ops.subtract(ops.multiply(self.compute(accum), momentum),
                                ops.multiply(grad, lr))
        step = velocity
        if self.nesterov:
            step = ops.subtract(ops.multiply(velocity, momentum), ops.multiply(grad, lr))
        self.assign(accum, ops.cast(velocity, accum.dtype))
        self.assign_add(variable, ops.cast(step, variable.dtype))

    def get_config(self):
        return {**super().get_config(), "momentum_accum_dtype": self.momentum_accum_dtype}

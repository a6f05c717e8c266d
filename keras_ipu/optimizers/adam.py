"""AdamIpuOptimizer: Adam as Graphcore's IPU optimizer computes it, with its
states in chosen precisions."""

import keras
from keras import ops

from keras_ipu.optimizers.ipu_optimizer_base import IpuOptimizerBase
from keras_ipu.optimizers.ipu_optimizer_base import dtype_name


@keras.saving.register_keras_serializable(package="keras_ipu")
class AdamIpuOptimizer(keras.optimizers.Adam, IpuOptimizerBase):
    """Adam (Kingma and Ba, 2014), optionally AMSGrad (Reddi et al.).

    The update is the paper's: m_hat = m / (1 - beta_1^t), v_hat = v /
    (1 - beta_2^t), var -= lr * m_hat / (sqrt(v_hat) + epsilon), with
    epsilon added to the debiased root (Keras' Adam adds it before
    debiasing, so the two differ by epsilon's scale). AMSGrad keeps the
    maximum of the debiased v.

    Args:
      learning_rate, beta_1, beta_2, epsilon, amsgrad, name: as Keras' Adam.
      m_dtype, v_dtype, vhat_dtype: the dtypes of the states m, v and vhat
        (None: the weight's).
      debiasing: debias m and v (False: use them as they are).
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-7, amsgrad=False, name="Adam", m_dtype=None,
                 v_dtype=None, vhat_dtype=None, debiasing=True, **kwargs):
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                         epsilon=epsilon, amsgrad=amsgrad, name=name, **kwargs)
        self.m_dtype = dtype_name(m_dtype)
        self.v_dtype = dtype_name(v_dtype)
        self.vhat_dtype = dtype_name(vhat_dtype)
        self.debiasing = debiasing

    def build(self, var_list):
        if self.built:
            return
        IpuOptimizerBase.build(self, var_list)
        self._momentums, self._velocities = self.add_moments(var_list)
        self._velocity_hats = []
        if self.amsgrad:
            self._velocity_hats = [self.add_state(v, "vhat", self.vhat_dtype)
                                   for v in var_list]

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        c = self.compute
        m_hat, v_hat = self.adam_moments(
            gradient, self._momentums[index], self._velocities[index],
            self.beta_1, self.beta_2, self.debiasing)
        if self.amsgrad:
            vhat = self._velocity_hats[index]
            v_hat = ops.maximum(c(vhat), v_hat)
            self.assign(vhat, ops.cast(v_hat, vhat.dtype))
        update = m_hat / (ops.sqrt(v_hat) + c(self.epsilon))
        self.assign_sub(variable, ops.cast(c(learning_rate) * update, variable.dtype))

    def get_config(self):
        return {**super().get_config(), "m_dtype": self.m_dtype,
                "v_dtype": self.v_dtype, "vhat_dtype": self.vhat_dtype,
                "debiasing": self.debiasing}

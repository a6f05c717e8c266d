"""LAMBIpuOptimizer: layer-wise adaptive moments (LAMB) as Graphcore's IPU
optimizer computes it."""

import re

import keras
from keras import ops

from keras_ipu.optimizers.ipu_optimizer_base import IpuOptimizerBase
from keras_ipu.optimizers.ipu_optimizer_base import dtype_name


@keras.saving.register_keras_serializable(package="keras_ipu")
class LAMBIpuOptimizer(IpuOptimizerBase):
    """LAMB (You et al., https://arxiv.org/abs/1904.00962).

    Per weight: m and v as Adam's (debiased unless debiasing=False), the
    update u = m_hat / (sqrt(v_hat) + epsilon) + weight_decay_rate * w,
    scaled by the trust ratio ||w|| / ||u|| (1 when either norm is 0;
    ||w|| first clipped to weight_norm_clip), then var -= lr * ratio * u.

    Args:
      learning_rate, beta_1, beta_2, epsilon: as Adam's (epsilon None or 0:
        Keras' epsilon()).
      weight_decay_rate: the decoupled weight decay added to the update.
      exclude_from_weight_decay, exclude_from_layer_adaptation: regular
        expressions; a weight whose path (`layer/kernel`) matches one gets
        no weight decay, no trust ratio.
      m_dtype, v_dtype: the dtypes of the states (None: the weight's).
      weight_norm_clip: the largest weight norm the ratio uses.
      optimizer_compute_precisions: two dtypes: the moments and the update
        in the first, the ratio times the update in the second.
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-6, weight_decay_rate=0.0,
                 exclude_from_weight_decay=None, exclude_from_layer_adaptation=None,
                 name="LAMB", debiasing=True, m_dtype=None, v_dtype=None,
                 weight_norm_clip=None,
                 optimizer_compute_precisions=("float32", "float32"), **kwargs):
        if len(optimizer_compute_precisions) != 2:
            raise ValueError(
                "Must provide a list of two elements for the optimizer compute "
                "precision. The final stage of the weight update can be done in "
                "a different precision to the initial stage.")
        super().__init__(learning_rate=learning_rate, name=name,
                         optimizer_compute_precisions=optimizer_compute_precisions,
                         **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon or keras.config.epsilon()
        self.weight_decay_rate = weight_decay_rate
        self.exclude_from_weight_decay = exclude_from_weight_decay
        self.exclude_from_layer_adaptation = exclude_from_layer_adaptation
        self.debiasing = debiasing
        self.m_dtype = dtype_name(m_dtype)
        self.v_dtype = dtype_name(v_dtype)
        self.weight_norm_clip = weight_norm_clip

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._m, self._v = self.add_moments(var_list)

    @staticmethod
    def _matches(patterns, name):
        return any(re.search(p, name) is not None for p in patterns or ())

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        c = self.compute
        m_hat, v_hat = self.adam_moments(gradient, self._m[index], self._v[index],
                                         self.beta_1, self.beta_2, self.debiasing)
        update = m_hat / (ops.sqrt(v_hat) + c(self.epsilon))
        name = variable.path
        if not self._matches(self.exclude_from_weight_decay, name):
            update = update + c(variable) * c(self.weight_decay_rate)
        ratio = c(1.0)
        if not self._matches(self.exclude_from_layer_adaptation, name):
            w_norm = ops.sqrt(ops.sum(ops.square(c(variable))))
            u_norm = ops.sqrt(ops.sum(ops.square(update)))
            if self.weight_norm_clip is not None:
                w_norm = ops.minimum(w_norm, c(self.weight_norm_clip))
            ratio = ops.where(
                ops.greater(w_norm, 0),
                ops.where(ops.greater(u_norm, 0), w_norm / u_norm, c(1.0)),
                c(1.0))
        final = self.opt_dtypes[1]
        ratio = ops.cast(c(learning_rate) * ratio, final)
        self.assign_sub(variable, ops.cast(ratio * ops.cast(update, final),
                                           variable.dtype))

    def get_config(self):
        return {
            **super().get_config(),
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
            "weight_decay_rate": self.weight_decay_rate,
            "exclude_from_weight_decay": self.exclude_from_weight_decay,
            "exclude_from_layer_adaptation": self.exclude_from_layer_adaptation,
            "debiasing": self.debiasing,
            "m_dtype": self.m_dtype,
            "v_dtype": self.v_dtype,
            "weight_norm_clip": self.weight_norm_clip,
        }

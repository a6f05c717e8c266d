"""IpuOptimizerBase: what Graphcore's IPU Keras optimizers add to Keras'
optimizers: the precision of the optimizer's computation and of each of its
states, chosen apart from the weights' precision."""

import keras
from keras import ops


def dtype_name(dtype):
    """A dtype given as a string, a NumPy or TensorFlow dtype, as Keras'
    string; None stays None."""
    if dtype is None:
        return None
    return keras.backend.standardize_dtype(getattr(dtype, "name", dtype))


class IpuOptimizerBase(keras.optimizers.Optimizer):
    """Base class of the IPU optimizers (not used directly).

    Args:
      optimizer_compute_precisions: the dtypes the stages of the update are
        computed in (one per stage of the subclass).
      outline_apply_gradients: on the IPU, the update is outlined into one
        reusable code block (less code, values unchanged); kept for the
        config, the simulator's values do not depend on it.
      outline_apply_gradients_kwargs: the outlining's options.
      Other keyword arguments are Keras' optimizer arguments (clipnorm,
      clipvalue, global_clipnorm, weight_decay, ...).
    """

    def __init__(self, *args, optimizer_compute_precisions=("float32",),
                 outline_apply_gradients=False,
                 outline_apply_gradients_kwargs=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.opt_dtypes = tuple(dtype_name(d) for d in optimizer_compute_precisions)
        self.outline_apply_gradients = outline_apply_gradients
        self.outline_apply_gradients_kwargs = dict(outline_apply_gradients_kwargs or {})

    def add_state(self, variable, name, dtype=None):
        """An optimizer state of `variable`'s shape, in `dtype` (None: the
        variable's dtype)."""
        return self.add_variable(
            shape=variable.shape, dtype=dtype or variable.dtype,
            name=f"{variable.path.replace('/', '_')}_{name}", initializer="zeros")

    def compute(self, x):
        """x in the precision of the update's first stage."""
        return ops.cast(x, self.opt_dtypes[0])

    def add_moments(self, var_list):
        """The m and v states adam_moments updates, one of each per weight,
        in the optimizer's m_dtype and v_dtype (None: the weight's)."""
        return ([self.add_state(v, "m", self.m_dtype) for v in var_list],
                [self.add_state(v, "v", self.v_dtype) for v in var_list])

    def adam_moments(self, gradient, m, v, beta_1, beta_2, debiasing):
        """Adam's moment update (m, v stored in their own dtypes) and the
        moments the update uses: debiased unless `debiasing` is False."""
        c = self.compute
        beta_1, beta_2 = c(beta_1), c(beta_2)
        grad = c(gradient)
        next_m = c(m) * beta_1 + grad * (1.0 - beta_1)
        next_v = c(v) * beta_2 + ops.square(grad) * (1.0 - beta_2)
        self.assign(m, ops.cast(next_m, m.dtype))
        self.assign(v, ops.cast(next_v, v.dtype))
        if not debiasing:
            return next_m, next_v
        step = c(self.iterations + 1)
        return (next_m / (1.0 - ops.power(beta_1, step)),
                next_v / (1.0 - ops.power(beta_2, step)))

    def get_config(self):
        return {
            **super().get_config(),
            "optimizer_compute_precisions": list(self.opt_dtypes),
            "outline_apply_gradients": self.outline_apply_gradients,
            "outline_apply_gradients_kwargs": self.outline_apply_gradients_kwargs,
        }

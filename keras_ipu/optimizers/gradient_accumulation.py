"""GradientAccumulationOptimizer: Graphcore's Keras optimizer wrapper that
updates the weights once every `num_mini_batches` steps with the sum of
their gradients (`ipu.keras.optimizers.GradientAccumulationOptimizer`)."""

import keras
from keras import ops
from keras.src.saving import serialization_lib
from keras.src.utils import tracking

from keras_ipu.optimizers.ipu_optimizer_base import dtype_name


@keras.saving.register_keras_serializable(package="keras_ipu")
class GradientAccumulationOptimizer(keras.optimizers.Optimizer):
    """Accumulates the gradients of `num_mini_batches` steps (summed, not
    averaged, as Graphcore's) and applies `opt` to their sum on the last of
    them; in between the weights and `opt`'s state do not change.

    With num_mini_batches == 1 the constructor returns `opt` itself.

    Args:
      opt: the Keras optimizer to wrap.
      num_mini_batches: steps per weight update (>= 1).
      offload_weight_update_variables, replicated_optimizer_state_sharding:
        where the IPU keeps the accumulators and optimizer state (remote
        memory, sharded over replicas); the simulator keeps them on the
        IPU, so they change neither values nor, yet, the prediction.
      dtype: the accumulators' dtype: None (the weight's), a dtype, or a
        callable from the weight to a dtype.
    """

    def __new__(cls, opt=None, num_mini_batches=None, *args, **kwargs):
        if num_mini_batches == 1:
            return opt
        return super().__new__(cls)

    def __init__(self, opt, num_mini_batches, offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding=False, dtype=None,
                 name="GradientAccumulationOptimizer"):
        if num_mini_batches < 1:
            raise ValueError("num mini batches must be >= 1")
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = opt
        self.num_mini_batches = int(num_mini_batches)
        self.offload_weight_update_variables = offload_weight_update_variables
        self.replicated_optimizer_state_sharding = replicated_optimizer_state_sharding
        self.accumulator_dtype = dtype

    def _dtype_of(self, variable):
        chosen = self.accumulator_dtype
        if callable(chosen) and not isinstance(chosen, type):
            chosen = chosen(variable)
        return dtype_name(chosen) or variable.dtype

    @tracking.no_automatic_dependency_tracking
    def build(self, var_list):
        self.mini_batch = self.add_variable(
            shape=(), dtype="int32", initializer="zeros", name="mini_batch")
        self.accumulators = [
            self.add_variable(shape=v.shape, dtype=self._dtype_of(v),
                              initializer="zeros",
                              name=f"{v.path.replace('/', '_')}_accumulator")
            for v in var_list
        ]
        self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        if not self.built:
            raise ValueError(
                f"To call `stateless_apply`, {type(self).__name__} must be built "
                "(optimizer.build(trainable_variables)).")
        own = len(self._variables)
        mapping = list(zip(self._variables, optimizer_variables[:own]))
        inner_values = list(optimizer_variables[own:])
        with keras.StatelessScope(state_mapping=mapping) as scope:
            update = ops.equal((self.mini_batch + 1) % self.num_mini_batches, 0)
            sums = [ops.add(acc, ops.cast(g, acc.dtype))
                    for acc, g in zip(self.accumulators, grads)]
            # The update as if this were the last mini-batch; kept only then
            # (both computed and selected: a branch cannot assign state in a
            # compiled step, see backend/trainer_ops/optimizer.py).
            new_trainable, new_inner = self.inner_optimizer.stateless_apply(
                inner_values,
                [ops.cast(s, v.dtype) for s, v in zip(sums, self._trainable_variables)],
                trainable_variables)
            new_trainable = [ops.where(update, n, o)
                             for n, o in zip(new_trainable, trainable_variables)]
            new_inner = [ops.where(update, n, o) for n, o in zip(new_inner, inner_values)]
            for acc, total in zip(self.accumulators, sums):
                acc.assign(ops.where(update, ops.zeros_like(total), total))
            self.mini_batch.assign(ops.where(update, 0, self.mini_batch + 1))
            self._iterations.assign_add(1)
        own_values = [scope.get_current_value(v) for v in self._variables]
        return new_trainable, own_values + new_inner

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        variables = trainable_variables or self._trainable_variables
        new_trainable, new_state = self.stateless_apply(
            [v.value for v in self.variables], grads, [v.value for v in variables])
        for variable, value in zip(variables, new_trainable):
            variable.assign(value)
        for variable, value in zip(self.variables, new_state):
            variable.assign(value)

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self.inner_optimizer.learning_rate = value

    def get_config(self):
        dtype = self.accumulator_dtype
        if callable(dtype) and not isinstance(dtype, type):
            raise ValueError(
                "A GradientAccumulationOptimizer whose dtype is a function "
                "cannot be saved: give the accumulators' dtype as a string.")
        return {
            "name": self.name,
            "opt": serialization_lib.serialize_keras_object(self.inner_optimizer),
            "num_mini_batches": self.num_mini_batches,
            "offload_weight_update_variables": self.offload_weight_update_variables,
            "replicated_optimizer_state_sharding":
                self.replicated_optimizer_state_sharding,
            "dtype": dtype_name(dtype),
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        opt = serialization_lib.deserialize_keras_object(
            config.pop("opt"), custom_objects=custom_objects)
        return cls(opt, **config)

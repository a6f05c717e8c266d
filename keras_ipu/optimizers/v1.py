"""Graphcore's TensorFlow 1 optimizer wrappers (`tensorflow.python.ipu.optimizers`)
for tf.compat.v1.train optimizers, in TensorFlow code compiled through the
TensorFlow front end (the estimators, ipu_compiler.compile, IPUStrategy.run).

IpuOptimizer forwards to the optimizer it wraps; CrossReplicaOptimizer
averages the gradients across the replicas (cross_replica_ops, an XLA
all-reduce) before applying them; MapGradientOptimizer maps each gradient
with a function of (gradient, variable); the gradient-accumulation
optimizers add each step's gradients into accumulators and apply them
every `num_mini_batches` steps (a conditional in the program, counted by a
step counter variable). ShardedOptimizer computes the gradients
co-located with their forward ops and gives each its forward op's shard
(sharding.propagate_sharding), so a sharded program (`scopes.ipu_shard`)
runs each backward op on its forward op's IPU; without it the placement
puts an unmarked op on the highest shard of the values it reads
(compiler/placement.py).
"""

import tensorflow as tf

from keras_ipu.gradient_accumulation import GradientAccumulationReductionMethod
from keras_ipu.ops import cross_replica_ops
from keras_ipu.ops import program_state

_Optimizer = tf.compat.v1.train.Optimizer


class IpuOptimizer(_Optimizer):
    """The wrapper interface for tf.compat.v1.train optimizers: every
    method not overridden is the wrapped optimizer's."""

    def __init__(self, opt, name=None):
        if not isinstance(opt, _Optimizer):
            raise TypeError(
                f"{type(self).__name__} wraps a tf.compat.v1.train.Optimizer, got "
                f"{type(opt).__name__}.")
        super().__init__(use_locking=False, name=name or opt.get_name())
        self._opt = opt

    def compute_gradients(self, loss, var_list=None, **kwargs):
        return self._opt.compute_gradients(loss, var_list=var_list, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return self._opt.apply_gradients(grads_and_vars, global_step, name)

    def get_slot(self, *args, **kwargs):
        return self._opt.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._opt.get_slot_names(*args, **kwargs)

    def get_name(self):
        return self._opt.get_name()

    def variables(self):
        return self._opt.variables()


class ShardedOptimizer(IpuOptimizer):
    """Forwards to `optimizer` (see the module doc on sharding)."""

    def __init__(self, optimizer):
        super().__init__(optimizer, name="ShardedOptimizer")

    def compute_gradients(self, loss, var_list=None, **kwargs):
        # As Graphcore's: each gradient op co-located with its forward op,
        # then given that op's shard, so it runs on the forward op's IPU.
        kwargs["colocate_gradients_with_ops"] = True
        grads = super().compute_gradients(loss, var_list=var_list, **kwargs)
        _propagate_sharding()
        return grads

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        applied = super().apply_gradients(grads_and_vars, global_step, name)
        _propagate_sharding()
        return applied


def _propagate_sharding():
    from keras_ipu.sharding import propagate_sharding

    propagate_sharding(tf.compat.v1.get_default_graph())


class CrossReplicaOptimizer(IpuOptimizer):
    """An optimizer that averages gradients across IPU replicas."""

    def __init__(self, opt, name="CrossReplicaOptimizer"):
        super().__init__(opt, name)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        summed = [(None if g is None else cross_replica_ops.cross_replica_mean(g), v)
                  for g, v in grads_and_vars]
        return self._opt.apply_gradients(summed, global_step, name)


class MapGradientOptimizer(IpuOptimizer):
    """Modifies the computed gradients with gradient_mapping_function(grad,
    var) before they are applied."""

    def __init__(self, wrapped_optimizer, gradient_mapping_function, name="MapGradientOptimizer"):
        super().__init__(wrapped_optimizer, name)
        self._gradient_mapping_function = gradient_mapping_function

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = self._opt.compute_gradients(*args, **kwargs)
        return [(None if g is None else self._gradient_mapping_function(g, v), v)
                for g, v in grads_and_vars]


class GradientAccumulationOptimizerV2(IpuOptimizer):
    """Accumulates the gradients of `num_mini_batches` steps and applies
    them with `opt` on the last of them (see Graphcore's documentation;
    offloading and replicated optimizer state sharding are placement
    choices of remote memory, which the simulator does not model, and are
    accepted)."""

    _cross_replica = False

    def __init__(self, opt, num_mini_batches, offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding=False, dtype=None,
                 reduction_method=GradientAccumulationReductionMethod.SUM,
                 name="GradientAccumulationOptimizerV2"):
        super().__init__(opt, name)
        if not isinstance(num_mini_batches, int) or num_mini_batches < 1:
            raise ValueError("num_mini_batches must be a positive number.")
        self._num_mini_batches = num_mini_batches
        self._dtype = dtype
        self._reduction_method = GradientAccumulationReductionMethod.parse(reduction_method)
        self.offload_weight_update_variables = offload_weight_update_variables
        self.replicated_optimizer_state_sharding = replicated_optimizer_state_sharding

    def _accumulator_dtype(self, var):
        if self._dtype is None:
            return var.dtype.base_dtype
        if callable(self._dtype) and not isinstance(self._dtype, tf.DType):
            return tf.as_dtype(self._dtype(var))
        return tf.as_dtype(self._dtype)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise ValueError("No gradients provided for any variable.")
        with tf.compat.v1.variable_scope(self._name + "_state", reuse=tf.compat.v1.AUTO_REUSE):
            counter = tf.compat.v1.get_variable(
                "mini_batch", shape=(), dtype=tf.int32, trainable=False,
                initializer=tf.compat.v1.zeros_initializer())
            accumulators = [
                tf.compat.v1.get_variable(
                    _safe_name(v) + "_accumulator", shape=v.shape,
                    dtype=self._accumulator_dtype(v), trainable=False,
                    initializer=tf.compat.v1.zeros_initializer())
                for _, v in pairs]
        n = tf.cast(counter, tf.float32)
        method = self._reduction_method
        updated = []
        for (g, _), acc in zip(pairs, accumulators):
            g = tf.cast(tf.convert_to_tensor(g), acc.dtype)
            if method == GradientAccumulationReductionMethod.SUM:
                new = acc + g
            elif method == GradientAccumulationReductionMethod.MEAN:
                new = acc + g / tf.cast(self._num_mini_batches, acc.dtype)
            else:  # RUNNING_MEAN: acc * n/(n+1) + g/(n+1)
                k = tf.cast(n, acc.dtype)
                new = acc * (k / (k + 1.0)) + g / (k + 1.0)
            updated.append(new)

        def apply(grads):
            if self._cross_replica:
                grads = [cross_replica_ops.cross_replica_mean(a) for a in grads]
            return self._opt.apply_gradients(
                [(a, v) for a, (_, v) in zip(grads, pairs)], global_step, name)

        return every_nth(counter, self._num_mini_batches, accumulators, updated, apply)


def every_nth(counter, n, accumulators, updated, use):
    """The in-program accumulation of n steps: at the n-th step (counted by
    the int32 variable `counter`), `use(updated)` (an operation on the
    accumulated values) then the accumulators and the counter reset; at the
    others the accumulators take `updated` and the counter counts."""
    # Poplar keeps these in the program's own buffers (program_state.py).
    program_state.mark(counter, *accumulators)
    last = tf.equal(counter + 1, n)

    def on_last():
        with tf.control_dependencies([use(updated)]):
            resets = [acc.assign(tf.zeros_like(acc)) for acc in accumulators]
            resets.append(counter.assign(0))
        return tf.group(resets)

    def keep():
        writes = [acc.assign(new) for acc, new in zip(accumulators, updated)]
        writes.append(counter.assign_add(1))
        return tf.group(writes)

    return tf.cond(last, on_last, keep)


class CrossReplicaGradientAccumulationOptimizerV2(GradientAccumulationOptimizerV2):
    """GradientAccumulationOptimizerV2 whose accumulated gradients are
    averaged across the replicas when they are applied."""

    _cross_replica = True

    def __init__(self, opt, num_mini_batches, offload_weight_update_variables=None,
                 replicated_optimizer_state_sharding=False, dtype=None,
                 reduction_method=GradientAccumulationReductionMethod.SUM,
                 name="CrossReplicaGradientAccumulationOptimizerV2"):
        super().__init__(opt, num_mini_batches, offload_weight_update_variables,
                         replicated_optimizer_state_sharding, dtype, reduction_method, name)


def _check_v1_usage(opt, verify_usage):
    if verify_usage and not isinstance(opt, (tf.compat.v1.train.GradientDescentOptimizer,
                                             tf.compat.v1.train.MomentumOptimizer)):
        raise ValueError(
            "GradientAccumulationOptimizer only supports GradientDescentOptimizer and "
            "MomentumOptimizer optimizers. Consider using the "
            "GradientAccumulationOptimizerV2 optimizer or use verify_usage=False.")


class GradientAccumulationOptimizer(GradientAccumulationOptimizerV2):
    """SDK 1.x's gradient accumulation: GradientDescentOptimizer and
    MomentumOptimizer only (verify_usage=False lifts the check)."""

    def __init__(self, opt, num_mini_batches, verify_usage=True,
                 name="GradientAccumulationOptimizer"):
        _check_v1_usage(opt, verify_usage)
        super().__init__(opt, num_mini_batches, name=name)


class CrossReplicaGradientAccumulationOptimizer(CrossReplicaGradientAccumulationOptimizerV2):
    """GradientAccumulationOptimizer averaging the accumulated gradients
    across the replicas when they are applied."""

    def __init__(self, opt, num_mini_batches, verify_usage=True,
                 name="CrossReplicaGradientAccumulationOptimizer"):
        _check_v1_usage(opt, verify_usage)
        super().__init__(opt, num_mini_batches, name=name)


def _safe_name(var):
    return var.name.split(":")[0].replace("/", "_")

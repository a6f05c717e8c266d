"""The ipu backend's optimizer base class.

Keras' generic `_backend_apply_gradients` branches with `ops.cond` whose
branches *assign* variables (gradient accumulation: update or accumulate;
EMA: overwrite the weights every `ema_overwrite_frequency` steps). Inside a
compiled, stateless step those assignments happen in a branch's own trace,
so the new values cannot leave the branch (a TracerConversionError). This
class computes both outcomes and keeps one with `where`, so every
assignment happens in the step's own trace; eagerly it gives the same
numbers as the generic code.

Keras picks it through `keras.src.optimizers.optimizer`'s backend chain
(the import hook adds `BackendOptimizer = IPUOptimizer` for "ipu").
"""

from keras.src import ops
from keras.src.optimizers import base_optimizer


class IPUOptimizer(base_optimizer.BaseOptimizer):
    def _backend_apply_gradients(self, grads, trainable_variables):
        if self.gradient_accumulation_steps:
            self._apply_accumulated(grads, trainable_variables)
        else:
            grads = self._clip_gradients(grads)
            self._apply_weight_decay(trainable_variables)
            self._backend_update_step(
                grads, trainable_variables, self.learning_rate
            )
        if self.use_ema:
            self._update_model_variables_moving_average(
                self._trainable_variables
            )
            if self.ema_overwrite_frequency:
                overwrite = (
                    self.iterations + 1
                ) % self.ema_overwrite_frequency == 0
                for var, average in zip(
                    self._trainable_variables,
                    self._model_variables_moving_average,
                ):
                    var.assign(ops.where(overwrite, average.value, var.value))

    def _apply_accumulated(self, grads, trainable_variables):
        steps = self.gradient_accumulation_steps
        is_update_step = (self._iterations + 1) % steps == 0
        # `trainable_variables` may be a filtered subset: map each to its
        # own accumulator.
        accumulators = [
            self._accumulated_gradients[self._get_variable_index(v)]
            for v in trainable_variables
        ]
        summed = [g + acc.value for g, acc in zip(grads, accumulators)]
        old_trainable = [v.value for v in trainable_variables]
        old_optimizer = [v.value for v in self.variables]

        # The update as if this were an update step...
        update_grads = self._clip_gradients([s / steps for s in summed])
        self._apply_weight_decay(trainable_variables)
        self._backend_update_step(
            update_grads, trainable_variables, self.learning_rate
        )
        # ...kept only on update steps.
        for var, old in zip(trainable_variables, old_trainable):
            var.assign(ops.where(is_update_step, var.value, old))
        for var, old in zip(self.variables, old_optimizer):
            var.assign(ops.where(is_update_step, var.value, old))
        for acc, total in zip(accumulators, summed):
            acc.assign(ops.where(is_update_step, ops.zeros_like(total), total))

"""The training state kept between executions, out of the Keras variables.

Between two executions of fit's train step nothing but the next execution
reads the model's state when no callback listens at batch level (the
trainer's `_batch_callbacks`): Keras calls nothing of the user's there.
The same holds for evaluate's test step (its metrics) and predict's step
(their seed state, and the weights they give back unchanged).
Then, as Keras' JAX trainer keeps its state between steps and writes it to
the variables only where something may look (`jax_state_sync`), the train
function keeps the compiled loop's results as its flat arrays and gives
them to the next run as they are (DeviceLoop.run_held): no walk over the
layers for the variables, no read and write of each variable, no
flattening, wrapping or checking of each value per execution. The values
are the same arrays the variables would have held, so the results are the
same bits.

The variables get the state when the executions of an epoch end (before
its epoch-end callbacks, validation and the metrics' results), when fit
stops for any reason (an error, Ctrl-C between executions) and before
anything else runs on the model: the trainer's `holding` context writes it
on leaving.
"""

import numpy as np

from keras_ipu.backend.trainer_ops import model_state
from keras_ipu.device import pytree
from keras_ipu.device.array import Tensor


class HeldState:
    """The state of one train function while it is held: `flat` (the
    arrays, None before the first execution) in the order of `treedef`
    (a device pytree of one list per kind of state), and the variables
    they belong to."""

    __slots__ = ("kinds", "private", "variables", "treedef", "flat")

    def __init__(self, kinds, private=True):
        self.kinds = kinds
        # Whether the arrays are the step's own (a train step's donated
        # state): evaluate's and predict's give back the weights they were
        # given, the variables' own arrays, stored as any value is.
        self.private = private
        self.variables = None
        self.treedef = None
        self.flat = None

    def keep(self, variables, state):
        """Hold `state` (the values of the model's `variables`, as
        model_state.read_state orders them; Tensors or arrays) instead of
        writing it to them."""
        if variables is not None:
            model_state.check_state_counts(variables, self.kinds, state)
            self.variables = variables
        leaves, self.treedef = pytree.flatten(state)
        self.flat = [x._value if type(x) is Tensor else np.asarray(x) for x in leaves]

    def state(self):
        """The held state as the step takes it (one list per kind)."""
        return pytree.unflatten(self.treedef, self.flat)

    def write(self):
        """Store the held state in the variables (as the execution's own
        write would: `private`) and hold nothing."""
        if self.flat is None:
            return
        state = pytree.unflatten(self.treedef, [Tensor(a) for a in self.flat])
        self.flat = None
        model_state.write_state(self.variables, self.kinds, state, private=self.private)

"""A model's state as plain values, and back.

Compiled steps are pure functions (DESIGN.md decision 6): they take every
variable's value as an input and return the new values. These helpers read
those values out of the Keras variables before an execution and write the
results back after it, so callbacks, evaluate() and the user always see
the current weights between executions.
"""

import numpy as np

from keras_ipu.device.array import Tensor

TRAIN_STATE = ("trainable", "non_trainable", "optimizer", "metrics")
TEST_STATE = ("trainable", "non_trainable", "metrics")
PREDICT_STATE = ("trainable", "non_trainable")


def variables_of(model, kind):
    if kind == "trainable":
        return model.trainable_variables
    if kind == "non_trainable":
        return model.non_trainable_variables
    if kind == "optimizer":
        return model.optimizer.variables
    if kind == "metrics":
        return model.metrics_variables
    raise ValueError(f"Unknown kind of model state {kind!r}; one of {TRAIN_STATE}.")


def state_variables(model, kinds):
    """One list of variables per kind, in `kinds` order (taken once per
    execution: walking the layers costs about as much as the assigns)."""
    return tuple(variables_of(model, kind) for kind in kinds)


def read_state(variables):
    """The current values of `variables` (as state_variables gives them)."""
    return tuple([v.value for v in group] for group in variables)


def read_owned_state(variables):
    """read_state for a step that updates the state in place (donation): the
    arrays it returns are given up to that step. A variable's array is given
    as it is only when the trainer stored it there and nobody has read it
    since (Variable._ipu_private); otherwise, or when another variable holds
    the same array, a copy is given, so a weight a callback or the user
    kept never changes under them."""
    seen = set()
    state = []
    for group in variables:
        values = []
        for v in group:
            tensor = v._value
            array = np.asarray(tensor)
            if not v._ipu_private or id(array) in seen:
                tensor = Tensor(np.array(array))
                array = tensor._value
            seen.add(id(array))
            values.append(tensor)
        state.append(values)
    return tuple(state)


def read_copied_state(variables):
    """read_owned_state for a step that may stop midway (floating-point
    traps): it is given copies, so the variables keep their values until
    the whole new state is stored."""
    return tuple([Tensor(np.array(v._value)) for v in group] for group in variables)


# Added to an error that stopped a program updating the state in place.
TORN_STATE_NOTE = (
    "The compiled step updates the model's weights and optimizer state in "
    "place, and this error stopped it midway: the model's variables may be "
    "partly updated (not all at one step). Restore them (model.load_weights "
    "from a checkpoint) or re-create the model before training on or saving."
)


def check_state_counts(variables, kinds, state):
    """A step's new `state` has one value per variable of each kind."""
    for kind, group, values in zip(kinds, variables, state):
        if len(group) != len(values):
            raise ValueError(
                f"The step returned {len(values)} {kind} values for the "
                f"model's {len(group)} {kind} variables. A custom "
                "train_step/test_step must return the state it was given, "
                "with the same number of entries of each kind."
            )


def write_state(variables, kinds, state, private=False):
    """Assign the values of `state` (as read_state gives it) to `variables`.
    `private`: the values are arrays nobody else holds (a compiled step's
    results), which the next step may update in place."""
    check_state_counts(variables, kinds, state)
    for group, values in zip(variables, state):
        for variable, value in zip(group, values):
            if (
                private
                and type(value) is Tensor
                and value.shape == variable.shape
                and value.dtype == variable._value.dtype
            ):
                # A step's result as the variable holds it: what assign()
                # would store, without its conversions and checks.
                variable._value = value
            else:
                variable.assign(value)
            if private:
                variable._ipu_private = True

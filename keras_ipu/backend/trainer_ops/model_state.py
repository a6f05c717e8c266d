"""A model's state as plain values, and back.

Compiled steps are pure functions (DESIGN.md decision 6): they take every
variable's value as an input and return the new values. These helpers read
those values out of the Keras variables before an execution and write the
results back after it, so callbacks, evaluate() and the user always see
the current weights between executions.
"""

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


def read_state(model, kinds):
    """One list of current values per kind, in `kinds` order."""
    return tuple([v.value for v in variables_of(model, kind)] for kind in kinds)


def write_state(model, kinds, state):
    """Assign the values of `state` (as read_state gives it) to the model."""
    for kind, values in zip(kinds, state):
        variables = variables_of(model, kind)
        if len(variables) != len(values):
            raise ValueError(
                f"The step returned {len(values)} {kind} values for the "
                f"model's {len(variables)} {kind} variables. A custom "
                "train_step/test_step must return the state it was given, "
                "with the same number of entries of each kind."
            )
        for variable, value in zip(variables, values):
            variable.assign(value)

"""What each input of a TensorFlow program is, for its profile report and
its cycle prediction: weights, optimizer state, metric state, or an
argument the host sends each run.

XLA hands the bridged program its parameters without saying which are
variables; the concrete function does: its captured resource handles are
the handles of `cf.variables`, and arguments may be variables themselves.
Among the variables, a Keras optimizer's are those in its name scope (its
`<name>/iteration` step counter is one of them: Keras 3 makes every
optimizer variable inside `name_scope(optimizer.name)`, so in TensorFlow
they are named `<name>/...`). Other trainable variables are weights, and
the non-trainable ones too (Keras' non-trainable weights: moving
statistics), unless the caller knows better (`known`: the TF front end's
Keras trainer names its model's metric variables).
"""

# Keras 3's BaseOptimizer counts its steps in a variable of this name
# (keras/src/optimizers/base_optimizer.py, `iterations`).
OPTIMIZER_COUNTER = "iteration"
ARGUMENT = "program inputs"


def variable_of(x, by_handle):
    """The tf.Variable an input is (a variable argument, or a captured
    resource handle of one of the function's variables), or None."""
    if hasattr(x, "handle") and hasattr(x, "trainable"):
        return x
    return by_handle.get(id(x))


def _scope(name):
    """`a/b/c:0` -> `a/b` (the name scope a variable was made in)."""
    return name.split(":")[0].rpartition("/")[0]


def optimizer_scopes(variables):
    """The name scopes holding a Keras optimizer's step counter."""
    scopes = set()
    for v in variables:
        name = v.name.split(":")[0]
        if name.rpartition("/")[2] == OPTIMIZER_COUNTER and not v.trainable:
            scopes.add(_scope(v.name))
    return scopes


def categories(variables, known=None):
    """The memory category of each input (profile.CATEGORIES' names);
    `variables`: per input, its tf.Variable or None (an argument); `known`:
    {id(tf.Variable): category} the caller is sure of."""
    known = known or {}
    scopes = optimizer_scopes(v for v in variables if v is not None)
    out = []
    for v in variables:
        if v is None:
            out.append(ARGUMENT)
        elif id(v) in known:
            out.append(known[id(v)])
        elif not v.trainable and any(
                v.name.startswith(s + "/") for s in scopes if s):
            out.append("optimizer state")
        else:
            out.append("weights")
    return tuple(out)

"""TF1-style variables that outlive the traces of a model function.

An estimator's `model_fn` creates its variables every time it is called
(`tf.compat.v1.get_variable`, a v1 optimizer's slots, `tf.compat.v1.metrics`'
accumulators, Keras layers): under TF1 each call built a new graph whose
variables a session restored from the checkpoint. Here `model_fn` is traced
into `tf.function`s the bridge compiles, several times (train, eval,
predict, each retrace), so this store makes the variables once:

    store = VariableStore()
    with store.trace():          # inside the traced function
        spec = model_fn(...)     # variables come from the store

Inside `trace()` a variable creator gives back the variable made by an
earlier trace under the same name (its n-th creation of that name, for
code such as Keras layers whose variables share short names), or makes it
outside the function (`tf.init_scope`), as `tf.function` lifts variables.
The TF1 collections the code reads (`tf.compat.v1.trainable_variables()`,
which `Optimizer.minimize` uses, the global step, local variables) are
filled for the graph being traced, starting empty for each trace as for a
new TF1 graph.
"""

import contextlib
import dataclasses
import threading

import numpy as np

_active = threading.local()


def active_store():
    """The store whose trace() is open on this thread, or None."""
    return getattr(_active, "store", None)


@dataclasses.dataclass
class Entry:
    variable: object
    collections: tuple  # TF1 collections it belongs to
    initial_value: np.ndarray  # for local variables (reset per evaluation)


class VariableStore:
    def __init__(self):
        self._entries = {}  # (name, occurrence) -> Entry
        self._seen = None  # per trace: name -> creations so far

    # -- queries --------------------------------------------------------------

    @property
    def entries(self):
        return dict(self._entries)

    def named(self):
        """{name: Entry} of every variable, named as TF1 names them in a
        checkpoint (a name's later creations get _1, _2, ...)."""
        return {name if occurrence == 0 else f"{name}_{occurrence}": entry
                for (name, occurrence), entry in self._entries.items()}

    def saveable(self):
        """{checkpoint name: variable} of the global (not local) variables."""
        return {name: entry.variable for name, entry in self.named().items()
                if not is_local(entry)}

    def reset_local_variables(self):
        """Give every local variable (metric accumulators) its initial value,
        as a new TF1 session's local variable initializer does."""
        for entry in self._entries.values():
            if is_local(entry):
                entry.variable.assign(entry.initial_value)

    # -- tracing --------------------------------------------------------------

    @contextlib.contextmanager
    def trace(self):
        import tensorflow as tf
        from tensorflow.python.framework import func_graph
        from tensorflow.python.ops import variable_scope

        graph = tf.compat.v1.get_default_graph()
        # A FuncGraph shares these collections (variables, the TF1 variable
        # store and scope) with the eager context's global graph, so traces
        # would see each other's variables; a TF1 graph starts empty.
        for key in func_graph.ALLOWLIST_COLLECTIONS:
            graph._collections[key] = []  # noqa: SLF001 - no public way to detach
        self._seen = {}
        outer, _active.store = active_store(), self
        try:
            with variable_scope.with_variable_store(variable_scope._VariableStore()):  # noqa: SLF001
                with tf.variable_creator_scope(self._creator):
                    yield self
        finally:
            self._seen = None
            _active.store = outer

    def _creator(self, next_creator, **kwargs):
        import tensorflow as tf

        name = _base_name(kwargs.get("name"))
        occurrence = self._seen.get(name, 0)
        self._seen[name] = occurrence + 1
        collections = _collections_of(kwargs)
        entry = self._entries.get((name, occurrence))
        if entry is None:
            with tf.init_scope():
                variable = next_creator(**kwargs)
                initial = np.asarray(variable.read_value())
            entry = Entry(variable, collections, initial)
            self._entries[(name, occurrence)] = entry
        elif tuple(entry.variable.shape) != tuple(tf.TensorShape(kwargs.get("shape")).as_list()
                                                  if kwargs.get("shape") is not None
                                                  else entry.variable.shape):
            raise ValueError(
                f"The model function made variable '{name}' with shape "
                f"{kwargs.get('shape')} but an earlier call made it with shape "
                f"{tuple(entry.variable.shape)}: a model function must make the "
                "same variables on every call (the checkpoint holds one of each).")
        graph = tf.compat.v1.get_default_graph()
        for key in collections:
            if not any(x is entry.variable for x in graph.get_collection(key)):
                graph.add_to_collection(key, entry.variable)
        return entry.variable


def is_local(entry):
    """A local variable (a metric's accumulator): not in checkpoints."""
    from tensorflow.compat.v1 import GraphKeys

    return GraphKeys.LOCAL_VARIABLES in entry.collections


def _base_name(name):
    if name is None:
        return "Variable"
    name = str(name)
    name = name[:-2] if name.endswith(":0") else name
    # A slot variable is named in a name scope ("w/Momentum/").
    return name.rstrip("/") or "Variable"


def _collections_of(kwargs):
    from tensorflow.compat.v1 import GraphKeys

    collections = list(kwargs.get("collections") or [GraphKeys.GLOBAL_VARIABLES])
    if kwargs.get("trainable", True) is not False and GraphKeys.LOCAL_VARIABLES not in collections:
        if GraphKeys.TRAINABLE_VARIABLES not in collections:
            collections.append(GraphKeys.TRAINABLE_VARIABLES)
    return tuple(collections)

"""IPUStrategy.run for Keras code: trace `fn` once, compile it for the
configured IPU device, run it on every replica.

`fn` may use Keras layers and models directly (stateful: `model(x)`,
`optimizer.apply(grads)`), keras.ops, and the stateless JAX-style calls
(`stateless_call`, `keras_ipu`'s `value_and_grad`, `stateless_apply`).
The Keras variables `fn` reads become inputs of the program and those it
assigns become outputs, written back to the variables after the run (as a
TensorFlow function on the IPU updates its resource variables). They are
found by a first, abstract trace of `fn` in a recording StatelessScope.

Arguments follow tf.function's rules: arrays (NumPy, Keras tensors) are
inputs of the program, other Python values (numbers, strings, objects) are
part of it: a new value traces and compiles again. float64 arrays are
refused, as Graphcore's IPUStrategy refuses them (the IPU has no float64).

Replication: the device of the strategy runs the program on as many
replicas as it has IPUs (a program of one shard). Each replica gets the
same arguments, except `PerReplica` values (component r for replica r);
cross-replica operations inside `fn` reduce over the replicas; the results
are replica 0's.
"""

import numpy as np

from keras.src import tree
from keras.src.backend.common.stateless_scope import StatelessScope
from keras.src.backend.common.variables import Variable

from keras_ipu.device.compiler.executable import programs_compute
from keras_ipu.device.interrupts import deferred_interrupts
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.jit import jit
from keras_ipu.device.simulator import replicas as _replicas
from keras_ipu.device.trace import current_builder
from keras_ipu.device.trace import trace_flat
from keras_ipu.distribute.replication import tracing_replicas
from keras_ipu.distribute.values import PerReplica

# Leaf kinds of fn's arguments.
_STATIC, _ARRAY, _PER_REPLICA, _VARIABLE = range(4)


def _is_array(x):
    return isinstance(x, np.ndarray | np.generic) or (
        hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "__array__")
    )


def _kind(leaf):
    if isinstance(leaf, PerReplica):
        return _PER_REPLICA
    if isinstance(leaf, Variable):
        return _VARIABLE
    if _is_array(leaf):
        return _ARRAY
    return _STATIC


def _static_key(value):
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return (type(value), value)


def _host_array(x, where):
    array = np.asarray(x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else x)
    if array.dtype == np.float64:
        raise TypeError(f"Unsupported data type for {where}: float64")
    return array


class _Recorder(StatelessScope):
    """A StatelessScope that notes the variables read and assigned."""

    def __init__(self):
        super().__init__()
        self.used = {}  # id -> variable, in order of first use

    def get_current_value(self, variable):
        self.used.setdefault(id(variable), variable)
        return super().get_current_value(variable)

    def add_update(self, update):
        self.used.setdefault(id(update[0]), update[0])
        super().add_update(update)


class _Program:
    """fn compiled for one signature of its arguments and one replication
    factor: its variables (inputs), the ones it assigns (outputs)."""

    def __init__(self, fn, structure, template, kinds, replicas, name):
        self.fn = fn
        self.structure = structure  # (args, kwargs) of the first call
        self.template = template  # the (args, kwargs) leaves; arrays: None
        self.kinds = kinds
        self.replicas = replicas
        self.variables = []
        self.assigned = []
        self.out_structure = None
        self._jitted = jit(self._pure)
        self._jitted.__name__ = name

    def _call_fn(self, dynamic, mapping):
        leaves = list(self.template)
        it = iter(dynamic)
        for i, kind in enumerate(self.kinds):
            if kind in (_ARRAY, _PER_REPLICA):
                leaves[i] = next(it)
        args, kwargs = tree.pack_sequence_as(self.structure, leaves)
        return self.fn(*args, **kwargs)

    def discover(self, avals):
        """The variables fn reads or assigns: an abstract trace in a
        recording scope, again while it keeps finding new ones (variables
        created on the way, as an optimizer building its slots)."""
        known = -1
        for _ in range(3):
            recorder = _Recorder()

            def traced(*tracers):
                with recorder, tracing_replicas(self.replicas):
                    out = self._call_fn(tracers, None)
                return [
                    x for x in tree.flatten(out)
                    if x is not None and _is_array(x)
                ]

            trace_flat(traced, avals)
            self.variables = list(recorder.used.values())
            if len(self.variables) == known:
                break
            known = len(self.variables)

    def _pure(self, var_values, dynamic):
        from keras_ipu.backend.core import convert_to_tensor

        mapping = list(zip(self.variables, var_values))
        with StatelessScope(state_mapping=mapping) as scope:
            initial = [scope.get_current_value(v) for v in self.variables]
            out = self._call_fn(dynamic, mapping)
        leaves = tree.flatten(out)
        self.out_structure = out
        self.out_mask = [x is None for x in leaves]
        flat = [convert_to_tensor(x) for x in leaves if x is not None]
        self.assigned = []
        updates = []
        for v, old in zip(self.variables, initial):
            new = scope.get_current_value(v)
            if new is not None and new is not old:
                self.assigned.append(v)
                updates.append(new)
        return flat, updates

    def __call__(self, per_replica_dynamic):
        var_values = [v.value for v in self.variables]
        with tracing_replicas(self.replicas):
            exe = self._jitted.executable(var_values, per_replica_dynamic[0])

        def run_one(dynamic):
            from keras_ipu.device.pytree import flatten

            arrays, _ = flatten((var_values, dynamic))
            return exe.run(*[np.asarray(a) for a in arrays])

        results = _replicas.run_replicated(
            run_one, [(d,) for d in per_replica_dynamic]
        )
        flat = results[0]
        n_out = len(flat) - len(self.assigned)
        if programs_compute():  # PRE_COMPILE's zeros are no new values
            # A Ctrl-C waits until every assigned variable is stored.
            with deferred_interrupts("the step's variable updates"):
                for v, value in zip(self.assigned, flat[n_out:]):
                    v.assign(value)
        it = iter(flat[:n_out])
        leaves = [None if none else next(it) for none in self.out_mask]
        return tree.pack_sequence_as(self.out_structure, leaves)


class StrategyRun:
    """The programs of one function run through a strategy, by signature."""

    def __init__(self, fn):
        self.fn = fn
        self._programs = {}

    def __call__(self, args, kwargs, replicas):
        structure = (tuple(args), dict(kwargs))
        leaves = tree.flatten(structure)
        kinds = tuple(_kind(x) for x in leaves)
        per_replica = [[] for _ in range(replicas)]
        key_parts = []
        template = []
        for i, (leaf, kind) in enumerate(zip(leaves, kinds)):
            if kind == _STATIC or kind == _VARIABLE:
                key_parts.append(_static_key(leaf))
                template.append(leaf)
                continue
            template.append(None)
            if kind == _PER_REPLICA:
                if len(leaf) != replicas:
                    raise ValueError(
                        f"A PerReplica argument has {len(leaf)} values but "
                        f"the program runs on {replicas} replicas: give one "
                        "value per replica."
                    )
                values = [_host_array(v, "input") for v in leaf.values]
            else:
                values = [_host_array(leaf, "input")] * replicas
            for r, value in enumerate(values):
                per_replica[r].append(value)
            key_parts.append((kind, values[0].shape, values[0].dtype.str))
        key = (
            repr(tree.map_structure(lambda _: 0, structure)),
            tuple(key_parts),
            replicas,
        )
        program = self._programs.get(key)
        if program is None:
            name = getattr(self.fn, "__name__", "fn")
            program = _Program(self.fn, structure, template, kinds, replicas, name)
            avals = [ShapedArray(a.shape, a.dtype) for a in per_replica[0]]
            program.discover(avals)
            self._programs[key] = program
        return program(per_replica)


def run_inline(fn, args, kwargs):
    """strategy.run called while another function is being traced: fn is
    part of that program (as a tf.function calling strategy.run)."""
    return fn(*args, **kwargs)


def inside_trace():
    return current_builder() is not None

"""One execution of an IPU-extended model: `steps_per_execution` steps on
each replica, in one compiled program per replica run side by side.

The execution's batches (the infeed) are dealt to the replicas as
Graphcore's infeed deals them: batch `t * replicas + r` is replica r's
step t. With `micro_batches` > 1 (gradient accumulation or a pipeline),
each replica's batches are grouped `micro_batches` at a time, stacked along
a new axis: one optimizer step each. Every replica runs the same compiled
device loop (trainer_ops/device_loop.py) on its own batches and its own
state; their collectives (the all-reduce of the gradients) meet in the
simulator (device/simulator/replicas.py).

State per replica (ReplicaStates): as on the IPU, each replica keeps its
own copy of the model's state between executions; they stay equal for the
weights and the optimizer (the same all-reduced update) and differ for
what each replica computes from its own batches: BatchNormalization
statistics, metrics, random seeds. The Keras variables show replica 0's
values; a value written to a variable on the host (a callback, the user,
reset_metrics) is sent to every replica before the next execution, as a
host-to-device copy is. Random seeds differ between replicas unless
`reset_ipu_seed(..., experimental_identical_replicas=True)` asks otherwise.
"""

import numpy as np

from keras.src import tree

from keras_ipu.backend.trainer_ops import model_state
from keras_ipu.backend.trainer_ops.device_loop import DeviceLoop
from keras_ipu.device.interrupts import deferred_interrupts
from keras_ipu.device.array import Tensor
from keras_ipu.device.simulator import replicas as sim_replicas
from keras_ipu.distribute.replication import tracing_replicas

# Added to the seed word of a seed generator's state per replica index (a
# 32-bit golden-ratio constant): replicas draw different random streams.
_REPLICA_SEED_STRIDE = 0x9E3779B9


def _is_seed_state(variable):
    return variable.name == "seed_generator_state"


def _identical_replica_seeds(strategy):
    from keras_ipu.device.config import system_config

    current = system_config.current_system()
    try:
        index = current.device(strategy._ipu_device).index
    except ValueError:
        return False
    return current.seeds.get(index, (None, False))[1]


class ReplicaStates:
    """The state of replicas 1..n-1 between executions (replica 0's is the
    Keras variables')."""

    def __init__(self, replicas, identical_seeds=False):
        self.replicas = replicas
        self.identical_seeds = identical_seeds
        self._copies = None  # per replica >= 1: flat list of Tensors
        self._written = None  # the Tensor stored in each variable

    def read(self, variables, donate):
        """The state of each replica for the variables (groups as
        model_state.state_variables gives them)."""
        read = model_state.read_owned_state if donate else model_state.read_state
        first = read(variables)
        if self.replicas == 1:
            return [first]
        flat_vars = [v for group in variables for v in group]
        flat_first = [x for group in first for x in group]
        if self._copies is None or len(self._copies[0]) != len(flat_vars):
            self._copies = [[None] * len(flat_vars) for _ in range(self.replicas - 1)]
            self._written = [None] * len(flat_vars)
        for k, variable in enumerate(flat_vars):
            if variable._value is self._written[k]:
                continue  # unchanged on the host: each replica keeps its own
            host = np.asarray(flat_first[k])
            for j, copies in enumerate(self._copies, start=1):
                value = np.array(host)
                if _is_seed_state(variable) and not self.identical_seeds:
                    value[0] = (int(value[0]) + j * _REPLICA_SEED_STRIDE) % 2**32
                copies[k] = Tensor(value)
        states = [first]
        for copies in self._copies:
            it = iter(copies)
            states.append(tuple([next(it) for _ in group] for group in variables))
        return states

    def write(self, variables, kinds, states):
        """Replica 0's new state to the variables; the others kept."""
        model_state.write_state(variables, kinds, states[0], private=True)
        if self.replicas == 1:
            return
        self._written = [v._value for group in variables for v in group]
        self._copies = [
            [x for group in state for x in group] for state in states[1:]
        ]


def _stack_micro_batches(batches, micro_batches):
    """Consecutive groups of `micro_batches` batches, each stacked along a
    new leading axis (one optimizer step's input)."""
    if micro_batches == 1:
        return batches
    groups = []
    for start in range(0, len(batches), micro_batches):
        group = batches[start:start + micro_batches]
        groups.append(tree.map_structure(
            lambda *xs: None if xs[0] is None else np.stack([np.asarray(x) for x in xs]),
            *group,
        ))
    return groups


class ReplicatedExecution:
    """Runs one execution of `step` over the batches of every replica.

    `kinds`: the model state the step takes (model_state.TRAIN_STATE, ...);
    `micro_batches`: batches per step (> 1: the step takes them stacked);
    `donate`: the step replaces the whole state (training); `options`: the
    CompileOptions of its programs.
    Call with the execution's batches; returns the chunks of each replica
    (see device_loop: per run of same-shaped batches, each output with a
    leading axis of one entry per step).
    """

    def __init__(self, model, step, kinds, replicas, micro_batches=1, donate=False,
                 options=None):
        self.model = model
        self.kinds = kinds
        self.replicas = replicas
        self.micro_batches = micro_batches
        self.donate = donate
        # state_kinds: the profile's memory categories (weights, optimizer
        # state, ...) and the out-of-memory advice read them.
        self.loop = DeviceLoop(step, compiled=True, donate_state=donate,
                               state_kinds=kinds, options=options,
                               micro_batches=micro_batches)
        self.device_loop = self.loop
        strategy = getattr(model, "_ipu_strategy", None)
        identical = strategy is not None and _identical_replica_seeds(strategy)
        self.states = ReplicaStates(replicas, identical_seeds=identical)
        self._split = False  # the loop's options name the model axis's split

    def __call__(self, batches):
        r = self.replicas
        if len(batches) % (r * self.micro_batches):
            raise ValueError(
                f"An execution of {len(batches)} batches cannot be dealt to "
                f"{r} replica(s) in steps of {self.micro_batches} micro-batch(es): "
                f"give a multiple of {r * self.micro_batches} batches."
            )
        per_replica = [
            _stack_micro_batches(batches[j::r], self.micro_batches) for j in range(r)
        ]
        # A Ctrl-C waits until every replica's state is stored (interrupts.py).
        with deferred_interrupts(f"the running execution ({len(batches)} batches)"):
            variables = model_state.state_variables(self.model, self.kinds)
            self._split_over_the_model_axis(variables)
            states = self.states.read(variables, self.donate)
            with tracing_replicas(r):
                self.loop.prepare(states[0], per_replica[0])
            results = sim_replicas.run_replicated(
                self.loop, [(state, data) for state, data in zip(states, per_replica)]
            )
            self.states.write(variables, self.kinds, [state for _, state in results])
        return [chunks for chunks, _ in results]


    def _split_over_the_model_axis(self, variables):
        """The loop's programs compiled split as the strategy's layouts say
        (a keras.distribution model axis: compiler/tensor_parallel.py); the
        loop's first inputs are the state's variables, in this order."""
        strategy = getattr(self.model, "_ipu_strategy", None)
        if strategy is None or strategy.model_axis_ipus == 1 or self._split:
            return
        flat = [v for group in variables for v in group]
        self.loop.options = strategy.compile_options(flat, self.loop.options)
        self._split = True  # before the loop compiles its first program


def flatten_micro_batches(chunks):
    """Chunks whose outputs are [steps, micro_batches, ...] as
    [steps * micro_batches, ...]: one entry per batch."""
    return [
        tree.map_structure(
            lambda x: None if x is None else x.reshape((-1,) + x.shape[2:]), chunk
        )
        for chunk in chunks
    ]

"""A program's run loop as one generated Python function, straight-line code.

The run loop (Executable.run_unchecked) walked a list of steps per run:
per kernel it unpacked the step's tuple, built the argument list from a
list of slots (a comprehension: one more Python call), stored the result
and looped over the slots to clear. That bookkeeping was about a quarter
of the Python a kernel costs beside its own wrapper (issue 16, eighth
pass: about 1 us per kernel, 83-92 kernels per demo_functional step, and
per time step of a scan's body: the LSTM's loop runs its body 64 times a
step). Here the same steps are written out once per program as Python
source, a local variable per slot:

    def run(arrays):
        s0, s1, s2 = arrays
        s4 = k0(s0, c3)
        del s0
        s5, s6 = k1(s4, s2)
        ...
        return [asarray(s5), array(c3)]

so a kernel call is a few fast-local loads and a store, and a slot's value
is dropped (`del`) at the step where it dies, as the loop cleared it, so
NumPy reuses its memory just the same. Kernels and constants are the
function's globals (k<i>, c<slot>). The kernels, their order, their
operands and what is freed when are exactly the steps', so the values
are the same bits.
"""

import numpy as np

# Beyond this many steps the source (and Python's compile of it: about
# 10 us per line) is not worth it for a program that may run once; the
# loop runs those. Far above any training step (demo_functional: 92).
MAX_STEPS = 20_000


# CPython's limit on the targets before a starred one in an unpacking.
_STAR_TARGETS = 256


def _slot(s, constants):
    return f"c{s}" if s in constants else f"s{s}"


def source_of(steps, n_inputs, constants, output_plan, extra_inputs=()):
    """(source, globals) of the straight-line function running `steps`
    ((kernel, operand slots, output slot(s), multiple-results flag, slots to
    clear), as Executable._bind makes them) on a list of `n_inputs` arrays;
    `constants` ({slot: array}) are read from the globals; `output_plan`
    ((slot, copy) per output: np.array for a copy, else np.asarray).
    `extra_inputs`: slots (none of the program's) given after the inputs in
    the same list (a scan's stacking slots: stack_slots.py)."""
    namespace = {"asarray": np.asarray, "array": np.array}
    for s, value in constants.items():
        namespace[f"c{s}"] = value
    lines = ["def run(arrays):"]
    inputs = (*range(n_inputs), *extra_inputs)
    if inputs:
        # One trailing comma makes a one-input unpack a tuple target.
        lines.append("    " + ", ".join(f"s{i}" for i in inputs) + ", = arrays")
    live = set(inputs)
    for k, (kernel, ins, out, multi, frees) in enumerate(steps):
        namespace[f"k{k}"] = kernel
        call = f"k{k}(" + ", ".join(_slot(s, constants) for s in ins) + ")"
        if multi:
            # `*_`: the loop zipped the results with the slots (any extra
            # result dropped). Python takes at most 255 targets before a
            # star; beyond, the results are unpacked exactly (control flow
            # with hundreds of carries: its kernels return one per output).
            targets = "".join(f"s{s}, " for s in out)
            if len(out) < _STAR_TARGETS:
                targets += "*_,"
            live.update(out)
        else:
            targets = f"s{out}"
            live.add(out)
        lines.append(f"    {targets} = {call}")
        # Only locals are deleted: a constant's slot is a global, and a
        # slot the loop would clear without having set it is no local yet.
        dead = [f"s{s}" for s in frees if s in live]
        if dead:
            live.difference_update(frees)
            lines.append("    del " + ", ".join(dead))
    outs = ", ".join(
        f"{'array' if copy else 'asarray'}({_slot(s, constants)})" for s, copy in output_plan)
    lines.append(f"    return [{outs}]")
    return "\n".join(lines) + "\n", namespace


def straight_line(steps, n_inputs, constants, output_plan, name="program", extra_inputs=()):
    """The function running `steps` (source_of) as the run loop does, or
    None for a program of more than MAX_STEPS steps. `name` names its
    source in tracebacks."""
    if len(steps) > MAX_STEPS:
        return None
    source, namespace = source_of(steps, n_inputs, constants, output_plan, extra_inputs)
    exec(compile(source, f"<run loop of {name}>", "exec"), namespace)
    # Taken out of its own globals: no reference cycle, so a dropped
    # program's kernels and constants go at once, not at the next
    # garbage collection.
    function = namespace.pop("run")
    function.source = source
    return function

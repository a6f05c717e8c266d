"""`jit(fn)`: trace on the first call for given input shapes/dtypes,
compile, cache, run.

    fast = jit(lambda x, w: keras.ops.relu(x @ w))
    y = fast(x, w)          # traces and compiles for (x, w)'s avals
    y = fast(x2, w)         # same avals: runs the cached executable

Arguments may be arrays or (nested) tuples/lists/dicts of arrays (pytrees,
pytree.py; None is an empty subtree); results are NumPy arrays in the
structure fn returned. Python scalars are weakly
typed as in Keras: a float is float32, an int int32 (not the 64-bit types
NumPy would pick, which the IPU would have to demote). Values fn closes over are
baked into the program as constants when it is traced (as in JAX): pass
what changes between calls as an argument. Called inside another trace,
the jitted function is inlined into it (it is traced, not run).

The program is compiled for the configured IPU system (compile errors such
as IPUOutOfMemoryError come from the first call); configuring another
system (other IPU version, tiles or floating-point behaviour) compiles
again.

Every new input signature (a new batch size, say) is a new program, as on
the IPU, whose programs have static shapes. A jitted function keeps only
the keys of its programs; the programs themselves live in the executable
cache (compiler/cache.py, 256 by default, least recently used dropped), so
memory stays bounded however many signatures come, and a dropped program
is traced and compiled again when its signature returns. When one function
has compiled RECOMPILE_WARNING_AT programs for one system (and again at
each doubling), a RecompileWarning says so and how to avoid it, as
TensorFlow's retracing warning does.
"""

import collections
import dataclasses
import warnings

import numpy as np

from keras_ipu.device import pytree
from keras_ipu.device import user_code
from keras_ipu.device.compiler import device_checks
from keras_ipu.device.compiler import progress
from keras_ipu.device.compiler.cache import CACHE
from keras_ipu.device.compiler.demotion import InputRangeError
from keras_ipu.device.compiler.options import CompileOptions
from keras_ipu.device.config import system_config
from keras_ipu.device.ir import ShapedArray
from keras_ipu.device.trace import Tracer
from keras_ipu.device.trace import current_builder
from keras_ipu.device.trace import trace_flat


def describe_leaf(structure, index):
    """How an error names leaf `index` of pytree.flatten(args): `argument 1[0]`."""
    start = 0
    for i, child in enumerate(pytree.children(structure)):
        paths = pytree.leaf_paths(child)
        if index < start + len(paths):
            return f"argument {i}{paths[index - start]}"
        start += len(paths)
    return f"input {index}"


def _as_array(x):
    if isinstance(x, bool):
        return np.asarray(x)
    if isinstance(x, int) and -(2**31) <= x < 2**31:
        return np.asarray(x, np.int32)
    if isinstance(x, float):
        return np.asarray(x, np.float32)
    return np.asarray(x)


def _donated_leaves(structure, argnums):
    """Flat positions of the leaves of the donated arguments."""
    positions, start = [], 0
    for i, child in enumerate(pytree.children(structure)):  # the arguments
        count = pytree.count_leaves(child)
        if i in argnums:
            positions.extend(range(start, start + count))
        start += count
    return tuple(positions)


# Distinct programs one jitted function may compile for one system before
# the RecompileWarning. fit() needs up to 3 per loop function (a full
# execution, the shortened last one, a smaller last batch).
RECOMPILE_WARNING_AT = 8


class RecompileWarning(UserWarning):
    """One function compiled for many input signatures."""


def _short_signature(signature):
    return ", ".join(ShapedArray(shape, dtype).short() for shape, dtype in signature)


def note_recompiles(name, count, signature, capacity):
    """The RecompileWarning of a function `name` compiled for its `count`-th
    input signature `signature` ((shape, dtype) per input): at
    RECOMPILE_WARNING_AT and each doubling."""
    if count < RECOMPILE_WARNING_AT or count & (count - 1):
        return  # below the threshold, or not a power of two
    warnings.warn(
        f"`{name}` has been compiled {count} times for this IPU "
        f"system, once per new input signature (the latest: "
        f"{_short_signature(signature)}). IPU programs have static "
        "shapes, so every new batch size (or other shape) traces and "
        "compiles a new program, which is slow; at most "
        f"{capacity} programs are kept, older ones compile "
        "again when needed. To compile once, feed one shape: a fixed "
        "batch size (tf.data: `.batch(n, drop_remainder=True)`; with "
        "arrays: a number of samples that the batch size divides, or "
        "pad the last batch), and call predict() with the same "
        "batch_size each time.",
        RecompileWarning,
        stacklevel=user_code.stacklevel(),
    )


class Jitted:
    """A function compiled per input signature (see the module doc)."""

    def __init__(self, fn, options=None, cache=None, donate_argnums=()):
        self.fn = fn
        self.options = options or CompileOptions()
        self.donate_argnums = tuple(sorted(set(donate_argnums)))
        self.cache = CACHE if cache is None else cache
        # (structure, (shape, dtype) per input, options id) -> (cache key,
        # out structure); the executable itself stays in the cache. Bounded
        # like the cache (least recently used dropped).
        self._signatures = collections.OrderedDict()
        self._compiles = collections.Counter()  # options id -> programs compiled
        # The options resolved for the configured system (target, fp
        # behaviour) and a small id for them: hashing the options on every
        # call would cost more than the lookup itself.
        self._context = None
        self._options = None
        self._options_id = None
        self._option_ids = {}
        self.trace_count = 0
        self.__name__ = getattr(fn, "__name__", "jitted")
        self.__doc__ = getattr(fn, "__doc__", None)

    def _inline(self, leaves):
        return current_builder() is not None or any(
            type(x) is Tracer for x in leaves
        )

    def executable(self, *args):
        """The Executable for these arguments (compiled if needed)."""
        leaves, structure = pytree.flatten(args)
        arrays = [_as_array(x) for x in leaves]
        return self._lookup(structure, arrays)[0]

    def executables(self):
        """The Executables compiled so far and still in the cache, oldest
        first (for profiles and TensorBoard's graph)."""
        found = (self.cache.peek(key) for key, _ in self._signatures.values())
        return [exe for exe in found if exe is not None]

    @property
    def signature_count(self):
        """How many input signatures this function has programs for now."""
        return len(self._signatures)

    def _lookup(self, structure, arrays):
        context = system_config.configuration()
        if context is not self._context:
            options = device_checks.resolve_options(self.options, context)
            # The disk cache in force is part of the key: after configuring
            # another --executable_cache_path, the first call of each
            # signature asks the cache again, which stores the program there.
            key = (options, context.flags.executable_cache_path)
            self._options_id = self._option_ids.setdefault(key, len(self._option_ids))
            self._options, self._context = options, context
        # (shape, dtype) pairs: a ShapedArray per input on every call cost
        # more than the rest of the lookup; built only to compile.
        signature = tuple([(a.shape, a.dtype) for a in arrays])
        key = (structure, signature, self._options_id)
        entry = self._signatures.get(key)
        if entry is not None:
            executable = self.cache.lookup(entry[0])
            if executable is not None:
                return executable, entry[1]
            # Dropped from the cache meanwhile: traced and compiled again.
        avals = tuple(ShapedArray(shape, dtype) for shape, dtype in signature)
        cache_key, executable, out_structure = self._compile(structure, avals, self._options)
        self._signatures[key] = (cache_key, out_structure)
        self._signatures.move_to_end(key)
        if len(self._signatures) > self.cache.capacity:
            self._signatures.popitem(last=False)
        self._note_compile(signature)
        return executable, out_structure

    def _note_compile(self, signature):
        count = self._compiles[self._options_id] = self._compiles[self._options_id] + 1
        note_recompiles(self.__name__, count, signature, self.cache.capacity)

    def _compile(self, structure, avals, options):
        out_structure = []

        def flat_fn(*tracers):
            result = self.fn(*pytree.unflatten(structure, tracers))
            leaves, s = pytree.flatten(result)
            out_structure.append(s)
            return leaves

        with progress.compiling(system_config.configuration().flags.show_progress_bar,
                                self.__name__) as bar:
            graph, captures = trace_flat(flat_fn, list(avals))
            bar.done("tracing", progress.count_nodes(graph))
            return self._compiled(graph, captures, structure, options, out_structure)

    def _compiled(self, graph, captures, structure, options, out_structure):
        self.trace_count += 1
        if captures:  # only possible inside another trace, which inlines
            raise AssertionError("a top-level trace captured outer values")
        if self.donate_argnums:
            options = dataclasses.replace(
                options, donated_inputs=_donated_leaves(structure, self.donate_argnums)
            )
        cache_key, executable = self.cache.get_keyed(graph, options, name=self.__name__)
        return cache_key, executable, out_structure[0]

    def __call__(self, *args):
        leaves, structure = pytree.flatten(args)
        if self._inline(leaves):
            return self.fn(*args)
        arrays = [_as_array(x) for x in leaves]
        executable, out_structure = self._lookup(structure, arrays)
        try:
            results = executable.run(*arrays)
        except InputRangeError as e:
            name = f"{describe_leaf(structure, e.index)} of `{self.__name__}`"
            raise e.renamed(name) from None
        return pytree.unflatten(out_structure, results)


def jit(fn=None, *, options=None, cache=None, donate_argnums=()):
    """Compile `fn` for the IPU (see the module doc). Usable as @jit too.

    `donate_argnums`: the positional arguments whose arrays the caller
    gives up (as jax.jit's): the program may overwrite them, typically to
    update state in place. The caller must not read them after the call;
    the results may occupy their memory.
    """
    if fn is None:
        return lambda f: Jitted(f, options=options, cache=cache,
                                donate_argnums=donate_argnums)
    return Jitted(fn, options=options, cache=cache, donate_argnums=donate_argnums)

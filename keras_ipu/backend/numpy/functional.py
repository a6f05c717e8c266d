"""Function transforms of keras.ops.numpy: vectorize."""

import re

from keras.src import tree

__all__ = ["vectorize"]

_DIMS = r"\w+(?:,\w+)*"
_ARG = rf"\((?:{_DIMS})?\)"
_ARGS = rf"{_ARG}(?:,{_ARG})*"
_SIGNATURE = re.compile(rf"^{_ARGS}->{_ARGS}$")


def _parse_signature(signature):
    """'(m,n),(n)->(m)' -> ([('m', 'n'), ('n',)], [('m',)])."""
    compact = signature.replace(" ", "")
    if not _SIGNATURE.match(compact):
        raise ValueError(
            f"Invalid vectorize signature {signature!r}: expected a "
            "generalized ufunc signature such as '(m,n),(n)->(m)'."
        )
    ins, outs = compact.split("->")

    def groups(text):
        return [
            tuple(d for d in g.split(",") if d)
            for g in re.findall(r"\(([^)]*)\)", text)
        ]

    return groups(ins), groups(outs)


def vectorize(pyfunc, *, excluded=None, signature=None):
    """numpy.vectorize on backend tensors.

    The loop (non-core) dimensions of all vectorized arguments are broadcast
    together and flattened into one axis, which `map` runs pyfunc over (a
    Python loop eagerly, one scan when traced).
    """
    excluded = set(excluded or ())
    in_core, out_core = (None, None)
    if signature is not None:
        in_core, out_core = _parse_signature(signature)

    def vectorized(*args):
        from keras_ipu.backend import numpy as knp
        from keras_ipu.backend.control_flow import map as map_fn
        from keras_ipu.backend.core import convert_to_tensor

        positions = [i for i in range(len(args)) if i not in excluded]
        arrays = [convert_to_tensor(args[i]) for i in positions]
        cores = in_core if in_core is not None else [()] * len(arrays)
        if len(cores) != len(arrays):
            raise TypeError(
                f"vectorize: the signature {signature!r} describes "
                f"{len(cores)} arguments but {len(arrays)} were given "
                "(not counting `excluded` ones)."
            )
        loop_shapes = []
        for x, core in zip(arrays, cores):
            if x.ndim < len(core):
                raise ValueError(
                    f"vectorize: an argument of shape {tuple(x.shape)} has "
                    f"fewer dimensions than its core dimensions {core} in "
                    f"the signature {signature!r}."
                )
            loop_shapes.append(tuple(x.shape[: x.ndim - len(core)]))
        loop_shape = _broadcast_loop_shapes(loop_shapes)
        flat = []
        for x, core in zip(arrays, cores):
            core_shape = tuple(x.shape[x.ndim - len(core):])
            x = knp.broadcast_to(x, loop_shape + core_shape)
            flat.append(knp.reshape(x, (-1,) + core_shape))

        def call_one(slices):
            full = list(args)
            for i, s in zip(positions, slices):
                full[i] = s
            return pyfunc(*full)

        ys = map_fn(call_one, flat)
        unknown = sum(d is None for d in loop_shape)

        def unflatten(y):
            if unknown > 1:
                return y
            shape = tuple(-1 if d is None else d for d in loop_shape)
            return knp.reshape(y, shape + tuple(y.shape[1:]))

        return tree.map_structure(unflatten, ys)

    return vectorized


def _broadcast_loop_shapes(shapes):
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        dims = [s[axis - ndim + len(s)] for s in shapes
                if axis - ndim + len(s) >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise ValueError(
                "vectorize: the loop dimensions of the arguments cannot be "
                f"broadcast together: {shapes}."
            )
        if known:
            out.append(known.pop())
        elif None in dims:
            out.append(None)
        else:
            out.append(1)
    return tuple(out)

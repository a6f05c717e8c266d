"""Pytrees of the device layer (it does not import Keras): nested tuples,
lists, namedtuples and dicts (keys sorted); None is an empty subtree (no
leaves), as in JAX; anything else is a leaf.

    leaves, treedef = flatten({"a": x, "b": (y, None)})   # [x, y]
    unflatten(treedef, [x2, y2])                         # {"a": x2, "b": (y2, None)}

A treedef is hashable (jit keys compiled signatures on it).
"""

LEAF = "*"  # the treedef of a leaf


def _treedef(tree, leaves):
    if tree is None:
        return None
    if isinstance(tree, (tuple, list)):
        return (type(tree), tuple(_treedef(t, leaves) for t in tree))
    if isinstance(tree, dict):
        keys = tuple(sorted(tree))
        return (type(tree), keys, tuple(_treedef(tree[k], leaves) for k in keys))
    leaves.append(tree)
    return LEAF


def flatten(tree):
    """(leaves, treedef) of `tree`."""
    leaves = []
    treedef = _treedef(tree, leaves)
    return leaves, treedef


def leaves(tree):
    return flatten(tree)[0]


def _build(treedef, it):
    if treedef is None:
        return None
    if treedef == LEAF:
        return next(it)
    kind = treedef[0]
    if issubclass(kind, dict):
        _, keys, children = treedef
        items = [(k, _build(c, it)) for k, c in zip(keys, children)]
        return dict(items) if kind is dict else kind(items)
    items = [_build(c, it) for c in treedef[1]]
    if hasattr(kind, "_fields"):  # namedtuples take positional fields
        return kind(*items)
    return kind(items)


def unflatten(treedef, leaves):
    """The tree of shape `treedef` holding `leaves` in order."""
    return _build(treedef, iter(leaves))


def count_leaves(treedef):
    if treedef is None:
        return 0
    if treedef == LEAF:
        return 1
    children = treedef[2] if issubclass(treedef[0], dict) else treedef[1]
    return sum(count_leaves(c) for c in children)


def children(treedef):
    """The treedefs of a tuple, list or dict node's children, in order."""
    return treedef[2] if issubclass(treedef[0], dict) else treedef[1]


def leaf_paths(treedef, prefix=""):
    """The path of each leaf of `treedef` ("[0]['k']"), in its order."""
    if treedef is None:
        return []
    if treedef == LEAF:
        return [prefix]
    if issubclass(treedef[0], dict):
        return [p for k, c in zip(treedef[1], treedef[2])
                for p in leaf_paths(c, f"{prefix}[{k!r}]")]
    return [p for i, c in enumerate(treedef[1]) for p in leaf_paths(c, f"{prefix}[{i}]")]


def flatten_like(treedef, tree, what="the tree"):
    """The leaves of `tree` where `treedef` has leaves: a None in `tree`
    stands for a whole subtree of None leaves (a zero cotangent)."""
    if treedef is None:
        return []
    if treedef == LEAF:
        return [tree]
    kind = treedef[0]
    subs = children(treedef)
    if issubclass(kind, dict):
        parts = [None if tree is None else tree[k] for k in treedef[1]]
    else:
        parts = [None] * len(subs) if tree is None else list(tree)
        if len(parts) != len(subs):
            raise ValueError(
                f"{what} has {len(parts)} entries where the structure has "
                f"{len(subs)}; pass the same structure.")
    return [leaf for s, p in zip(subs, parts) for leaf in flatten_like(s, p, what)]

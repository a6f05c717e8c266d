"""Compile options: which passes run and their limits. Part of the cache
key, so executables compiled with different options never mix."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    fold_constants: bool = True
    # A constant-folded value bigger than this stays a computation: baking a
    # huge array into the executable costs memory on every tile it lives on.
    fold_limit_bytes: int = 1 << 20
    eliminate_common_subexpressions: bool = True
    eliminate_dead_code: bool = True
    fuse_elementwise: bool = True
    # IPU rule: no 64-bit floats/ints on the device.
    demote_64bit: bool = True

    def cache_key(self):
        return repr(dataclasses.astuple(self))

"""Where one IPU's tensors and code sit on its tiles.

A tensor is mapped linearly ([POPUTIL] in cost_model.linear_mapping) and
starts at the tile after the previous linearly mapped tensor ([TFMAP]: the
running offset of Graphcore's TensorFlow backend; a tensor over every tile
starts at tile 0). Tensors are placed in the order the program allocates
them: its inputs, its constants, then the results of its steps in program
order (a control-flow step's sub-graphs before its own results).

Code ([TFREPORT] in cost_model): every tile holds the fixed control and
host exchange code; each program step adds its code on the tiles it
touches (those holding its operands or results on this IPU), and each
vertex type (a primitive and the dtype of its result) its codelet once on
every tile where a step of that type writes results.

The memory model weighs live values as TileLoads: bytes per tile, compared
by the fullest tile they make on top of the always-live bytes.
"""

import numpy as np

from keras_ipu.device import liveness
from keras_ipu.device.ir import subgraphs
from keras_ipu.device.simulator import cost_model


def distribution(nbytes, itemsize, tiles, start=0):
    """Bytes per tile (an int64 array of `tiles`) of a tensor of `nbytes`
    mapped linearly from tile `start` on, wrapping past the last tile."""
    out = np.zeros(tiles, np.int64)
    used, per_tile = cost_model.linear_mapping(nbytes, itemsize, tiles)
    if used:
        last = (start + used - 1) % tiles
        if start <= last:
            out[start:last] = per_tile
        else:  # wraps past the last tile
            out[start:] = per_tile
            out[:last] = per_tile
        out[last] = nbytes - (used - 1) * per_tile
    return out


def _span(start, used, tiles):
    """The tile indices `used` tiles from `start` cover (wrapping)."""
    return (start + np.arange(used)) % tiles


class Layout:
    """The start tile of each tensor of one IPU's program, in allocation
    order ([TFMAP]), and the code on each tile ([TFREPORT])."""

    def __init__(self, tiles, held=None):
        self.tiles = tiles
        # {key: the aval the IPU holds of it} where that is not the tensor's
        # own (a feed's one element: simulator/feeds.py).
        self.held = dict(held or {})
        self.starts = {}
        self.code = np.full(tiles, cost_model.CONTROL_CODE_BYTES_PER_TILE, np.int64)
        self._next = 0
        self._codelets = {}  # vertex type -> bool mask of the tiles running it

    def aval(self, key, aval):
        """What the IPU holds of the tensor `key` (of `aval`)."""
        return self.held.get(key, aval)

    def place(self, key, aval):
        """Map the tensor `key` (of `aval`) at the running offset."""
        if key in self.starts:
            return
        aval = self.aval(key, aval)
        used = cost_model.tiles_used(aval.nbytes or 0, aval.dtype.itemsize, self.tiles)
        if 0 < used < self.tiles:
            self.starts[key] = self._next
            self._next = (self._next + used) % self.tiles
        else:
            self.starts[key] = 0

    def start(self, key):
        return self.starts.get(key, 0)

    def tiles_of(self, key, aval):
        aval = self.aval(key, aval)
        used = cost_model.tiles_used(aval.nbytes or 0, aval.dtype.itemsize, self.tiles)
        return _span(self.start(key), used, self.tiles)

    def vector(self, key, aval):
        """Bytes per tile of the tensor `key`."""
        aval = self.aval(key, aval)
        return distribution(aval.nbytes or 0, aval.dtype.itemsize, self.tiles, self.start(key))

    def add_step(self, node, operands, results):
        """The code of one program step on the tiles holding `operands` and
        `results` (Vars of this IPU), its codelet where it writes results."""
        touched = np.zeros(self.tiles, bool)
        written = np.zeros(self.tiles, bool)
        for v in operands:
            touched[self.tiles_of(v, v.aval)] = True
        for v in results:
            written[self.tiles_of(v, v.aval)] = True
        touched |= written
        self.code[touched] += cost_model.CODE_BYTES_PER_STEP_PER_TILE
        if results:
            kind = (node.primitive.name, str(results[0].aval.dtype))
            mask = self._codelets.setdefault(kind, np.zeros(self.tiles, bool))
            fresh = written & ~mask
            self.code[fresh] += cost_model.VERTEX_CODE_BYTES_PER_CODELET
            mask |= written


def layout(graph, tiles, inputs, constants, is_step, holds, in_place=None, held=None):
    """The Layout of a program on one IPU: `inputs` (Vars) and `constants`
    (avals, keyed ("constant", k)) first, then the results `holds(var)`
    accepts of every node, sub-graphs included; the code of the outer
    steps `is_step(node)` accepts. in_place(node, dying) -> per output the
    operand whose memory it takes over (memory_model.in_place), in program
    order: such a result sits where that operand does. held: {Var: the aval
    the IPU holds of it} where not its own (Layout.held)."""
    out = Layout(tiles, held)
    for v in inputs:
        out.place(v, v.aval)
    for k, aval in enumerate(constants):
        out.place(("constant", k), aval)

    def allocate(g):
        dying = liveness.analyze(g).dying if in_place is not None else {}
        for i, node in enumerate(g.nodes):
            for sub in subgraphs(node):
                allocate(sub)
            into = in_place(node, set(dying.get(i, ()))) if in_place is not None else None
            for k, v in enumerate(node.outputs):
                source = into[k] if into is not None else None
                if source is not None and source in out.starts:
                    out.starts[v] = out.starts[source]
                elif holds(v):
                    out.place(v, v.aval)

    allocate(graph)
    for node in graph.nodes:
        if is_step(node):
            out.add_step(node, [v for v in node.inputs if v in out.starts],
                         [v for v in node.outputs if v in out.starts])
    return out


class TileLoad:
    """Bytes per tile of a set of live values, on top of `base` (the
    always-live bytes per tile). Sums like a number; compares by `excess`,
    how far the fullest tile of base + load rises above base's fullest,
    then (between loads) by the bytes in all, so that of two steps that
    leave the fullest tile as it is the one holding more is the peak.
    `sign` -1 is the load taken away (what -1 * load gives, without a copy)."""

    __slots__ = ("vector", "base", "sign", "_key")

    def __init__(self, vector, base, sign=1):
        self.vector, self.base, self.sign = vector, base, sign
        self._key = None  # (excess, bytes), computed when first compared

    @property
    def key(self):
        if self._key is None:
            base = self.base
            v = self.vector if self.sign > 0 else -self.vector
            excess = int((base + v).max() - base.max())
            self._key = (excess, int(v.sum()))
        return self._key

    @property
    def excess(self):
        return self.key[0]

    def _pair(self, other):
        if isinstance(other, TileLoad):
            return self.key, other.key
        return self.excess, other

    def __add__(self, other):
        if isinstance(other, TileLoad):
            mine = self.vector if self.sign > 0 else -self.vector
            if other.sign > 0:
                return TileLoad(mine + other.vector, self.base)
            return TileLoad(mine - other.vector, self.base)
        if other == 0:
            return self if self.sign > 0 else TileLoad(-self.vector, self.base)
        return NotImplemented

    __radd__ = __add__

    def __rmul__(self, sign):
        if sign == 1:
            return self
        if sign == -1:
            return TileLoad(self.vector, self.base, -self.sign)
        return TileLoad(sign * self.sign * self.vector, self.base)

    def __gt__(self, other):
        a, b = self._pair(other)
        return a > b

    def __lt__(self, other):
        a, b = self._pair(other)
        return a < b

    def __ge__(self, other):
        a, b = self._pair(other)
        return a >= b

    def __le__(self, other):
        a, b = self._pair(other)
        return a <= b

    def __int__(self):
        return self.excess

"""sort: the comparator computation read as sort keys.

TensorFlow's sorts (tf.sort, argsort, top_k, unique) use comparators of
the form `compare(p0.lhs, p0.rhs, LT|GT)`, possibly lexicographic over
several operands (`select(eq(k0), cmp(k1), cmp(k0))` or `or(lt0, and(eq0,
lt1))`). The sort primitive orders by leading keys, ascending or
descending, stably; the comparator is matched to that and any other
comparator fails naming it.
"""

from keras_ipu.device.primitives import sort as sort_prims
from keras_ipu.frontends.tensorflow.importer import HloImportError
from keras_ipu.frontends.tensorflow.importer import rule


def _keys(comp):
    """[(operand index, descending)] of a comparator, most significant
    first, or None when it is not a key comparison."""
    by_id = {i.id: i for i in comp.instructions}
    params = {i.id: i.parameter_number for i in comp.instructions
              if i.opcode == "parameter"}

    def follow(i):
        node = by_id[i]
        while node.opcode in ("convert", "reshape", "copy") and node.operand_ids:
            node = by_id[node.operand_ids[0]]
        return node

    def compare_key(node):
        if node.opcode != "compare" or node.comparison_direction not in ("LT", "GT"):
            return None
        a, b = (follow(o) for o in node.operand_ids)
        if a.id not in params or b.id not in params:
            return None
        pa, pb = params[a.id], params[b.id]
        if pa % 2 or pb != pa + 1:
            if pb % 2 == 0 and pa == pb + 1:  # compare(rhs, lhs): flipped
                return (pb // 2, node.comparison_direction == "LT")
            return None
        return (pa // 2, node.comparison_direction == "GT")

    def equal_key(node):
        if node.opcode != "compare" or node.comparison_direction != "EQ":
            return None
        a, b = (follow(o) for o in node.operand_ids)
        if a.id in params and b.id in params and {params[a.id], params[b.id]} == {
                params[a.id] - params[a.id] % 2, params[a.id] - params[a.id] % 2 + 1}:
            return params[a.id] // 2
        return None

    def walk(node):
        key = compare_key(node)
        if key is not None:
            return [key]
        if node.opcode == "select":
            cond, then, other = (follow(o) for o in node.operand_ids)
            eq = equal_key(cond)
            if eq is None:
                return None
            tail, head = walk(then), walk(other)
            if tail is None or head is None or head[0][0] != eq:
                return None
            return head + tail
        if node.opcode == "or":
            first, rest = (follow(o) for o in node.operand_ids)
            head = walk(first)
            if head is None or rest.opcode != "and":
                return None
            eq_node, tail_node = (follow(o) for o in rest.operand_ids)
            if equal_key(eq_node) is None:
                eq_node, tail_node = tail_node, eq_node
            if equal_key(eq_node) != head[0][0]:
                return None
            tail = walk(tail_node)
            return None if tail is None else head + tail
        return None

    return walk(follow(comp.root_id))


@rule("sort")
def _sort(imp, instr, operands):
    comp = imp.called(instr)
    keys = _keys(comp)
    if not keys:
        raise HloImportError(
            f"the sort comparator {comp.name!r} is not a comparison of sort "
            "keys (LT/GT on operands, possibly lexicographic); other orders "
            "are not supported."
        )
    directions = {d for _, d in keys}
    if len(directions) != 1:
        raise HloImportError("a sort with ascending and descending keys mixed is not supported.")
    order = [k for k, _ in keys]
    seen = set()
    order = [k for k in order if not (k in seen or seen.add(k))]
    rest = [i for i in range(len(operands)) if i not in order]
    arrays = [imp.array(x) for x in operands]
    permuted = [arrays[i] for i in order + rest]
    (dimension,) = instr.dimensions
    out = imp.bind(sort_prims.sort_p, *permuted, dimension=int(dimension),
                   num_keys=len(order), descending=directions.pop())
    out = list(out)
    result = [None] * len(operands)
    for pos, i in enumerate(order + rest):
        result[i] = out[pos]
    return result[0] if len(operands) == 1 and not _is_tuple_shape(instr) else tuple(result)


def _is_tuple_shape(instr):
    from keras_ipu.frontends.tensorflow import hlo_proto

    return hlo_proto.is_tuple(instr.shape)

"""Which steps are in-place updates: the one predicate the run loop's
orderings share (early_updates.py moves them up to their gradients,
concurrent_steps.py launches one with the product making its gradient).
"""

# What an update may allocate beyond the operands it writes into: a
# bias's update donates m and v but makes its new value (2 KiB for 512).
MAX_NEW_BYTES = 16 * 1024


def result_bytes(node):
    """Bytes of the node's results; None when a shape is not static."""
    total = 0
    for v in node.outputs:
        if not v.aval.is_static():
            return None
        total += v.aval.nbytes
    return total


def donated_slots(step, node):
    """The slots of the operands the step (a run-loop step: kernel, operand
    slots, ...) writes into: those its node donates (donation.py)."""
    ins = step[1]
    return {ins[k] for k in node.params.get("donate", ())}


def is_update(node):
    """Whether the node is an in-place update: a fused chain donating
    operands that take all its results but MAX_NEW_BYTES."""
    donate = node.params.get("donate", ())
    if node.primitive.name != "fused_elementwise" or not donate:
        return False
    made = result_bytes(node)
    if made is None or any(not node.inputs[k].aval.is_static() for k in donate):
        return False
    return made <= sum(node.inputs[k].aval.nbytes for k in donate) + MAX_NEW_BYTES

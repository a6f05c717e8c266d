"""Pipeline stages of an imported TensorFlow program, from its op names.

The compiler's placement pass (device/compiler/placement.py) puts a node on
the stage it records (`node.stage`, what trace.stage_scope records on the
ipu backend). A TensorFlow program has no such record, but every HLO
instruction keeps the name of the TensorFlow op that made it (metadata
op_name, with its name scopes: "while/pipeline_stage_1/dense/MatMul"), and
the importer gives each node that name as its source. So a rule from op
name to stage places an imported program:

    bridged = BridgedFunction(fn, stage_of=pipeline_stage_of, device_mapping=(0, 1))

or, on a graph already imported, `staged_by_name(graph, rule)` and
`CompileOptions(placement=Placement.of({}, device_mapping))`.

A name the rule gives None runs where the placement pass decides (where the
values it reads are). TensorFlow names a gradient op after the forward op
it differentiates ("gradient_tape/while/pipeline_stage_1/dense/MatMul/
MatMul_1"), so the backward pass of a stage runs on that stage, as Poplar
places it.

The rule Graphcore's functional pipelining implies (`pipeline_stage_of`):
stage k's computation is traced in the name scope `pipeline_stage_<k>`
(Graphcore's pipelining_ops names its stages so; keras_ipu's
ops/functional_pipeline.py and the tf.keras trainer do too). TensorFlow
makes a name scope entered twice unique with a suffix ("pipeline_stage_1_1"),
which names the same stage.
"""

import re

from keras_ipu.device.compiler.placement import with_stages

STAGE_SCOPE_PREFIX = "pipeline_stage_"
# "pipeline_stage_<k>", or TensorFlow's unique form of it "..._<k>_<n>".
_STAGE_SCOPE = re.compile(rf"^{STAGE_SCOPE_PREFIX}(\d+)(?:_\d+)?$")


def stage_scope_name(stage):
    """The TensorFlow name scope of pipeline stage `stage`."""
    return f"{STAGE_SCOPE_PREFIX}{int(stage)}"


def name_scope(stage):
    """The TensorFlow name scope whose ops run on pipeline stage `stage`."""
    import tensorflow as tf

    return tf.name_scope(stage_scope_name(stage))


def pipeline_stage_of(op_name):
    """The stage of a TensorFlow op traced inside `stage_scope_name(k)`
    (the innermost such scope of its name), else None."""
    if not op_name:
        return None
    for part in reversed(op_name.split("/")):
        found = _STAGE_SCOPE.match(part)
        if found:
            return int(found.group(1))
    return None


def staged_by_name(graph, rule):
    """`graph` (an imported program, not yet placed) with each node's stage
    set to rule(its TensorFlow op name), sub-graphs included; a node the
    rule gives None (or that has no op name) keeps the stage it had."""

    def stage(node):
        if not isinstance(node.source, str):
            return node.stage
        found = rule(node.source)
        if found is None:
            return node.stage
        if not isinstance(found, int) or isinstance(found, bool) or found < 0:
            raise ValueError(
                f"The stage rule gave {found!r} for the TensorFlow op "
                f"{node.source!r}: a stage is a non-negative int (or None for "
                "an op the placement pass places by its inputs)."
            )
        return found

    return with_stages(graph, stage)

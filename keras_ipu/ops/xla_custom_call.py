"""keras_ipu's own IPU operators carried through TensorFlow's XLA bridge as
XLA custom calls.

Graphcore's operators (reduce-scatter, print, CTC beam search, ...) are
Poplar ops TensorFlow has no kernel for. A TensorFlow function that uses
one here emits an `XlaCustomCallV2` with its own target name and its
parameters as JSON in the backend config; XLA keeps the call in the HLO it
hands the front end, whose importer maps the target to a device primitive
by the rule registered with `import_rule`. Rules are registered with the
importer when the first call of their target is emitted, so `import
keras_ipu` loads neither TensorFlow nor the front end.
"""

import json

_rules = {}
_registered = set()


def import_rule(target):
    """Decorator: `fn(imp, instr, operands, config)` imports custom call
    `target` (config: its parameters, a dict)."""

    def register(fn):
        _rules[target] = fn
        return fn

    return register


def _register(target):
    if target in _registered:
        return
    from keras_ipu.frontends.tensorflow.opcodes.linalg import register_custom_call

    fn = _rules[target]
    register_custom_call(target)(
        lambda imp, instr, operands: fn(imp, instr, operands, config_of(instr)))
    _registered.add(target)


def config_of(instr):
    """The parameters an emitted call carries (its backend config)."""
    text = bytes(instr.backend_config or b"").decode("utf-8")
    return json.loads(text) if text else {}


def emit(target, inputs, result_dtypes, result_shapes, config=None, has_side_effect=False):
    """The results (a list) of custom call `target` on the tensors `inputs`.
    A call with a side effect is kept by XLA even when its results are not
    used."""
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops

    _register(target)
    return gen_xla_ops.xla_custom_call_v2(
        list(inputs), call_target_name=target,
        backend_config=json.dumps(config or {}, sort_keys=True),
        has_side_effect=has_side_effect, result_dtypes=list(result_dtypes),
        result_shapes=list(result_shapes))

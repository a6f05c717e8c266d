"""What an overflow trap on the loss-scaled backward pass means.

Under `mixed_float16`, Keras wraps the optimizer in a LossScaleOptimizer
that multiplies the loss by a scale (2**15 at first) before the gradients
are taken, so every gradient of the backward pass is that many times
larger. Keras' scale is dynamic: a step whose scaled gradients overflow
float16 is skipped and the scale halved, so overflows in the first steps
are expected. With `floating_point_behaviour.oflo` on, the IPU stops at
the first of them instead, on clean data.

Graphcore's SDK has no dynamic scale to fall back on here: its
half-precision guide (tutorials, "Underflowing gradients and loss
scaling") says to use the highest loss scale that does not overflow, and
to find it with the floating-point exceptions on. So the error says it is
the scaled backward pass, and offers both ways out: a lower fixed starting
scale, or no overflow trap (the dynamic scale then adjusts itself).
"""

from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

from keras_ipu.device.simulator.numerics import IPUOverflowError


def explain_overflow(model, error):
    """`error` (an IPUFloatingPointError from a train step), or an
    IPUOverflowError that says the loss scale caused it when the overflow
    is on the backward pass of a model trained with loss scaling."""
    optimizer = getattr(model, "optimizer", None)
    if not (
        isinstance(error, IPUOverflowError)
        and error.backward
        and isinstance(optimizer, LossScaleOptimizer)
    ):
        return error
    scale = float(optimizer.dynamic_scale.numpy())
    lower = max(scale / 2**8, 1.0)
    head = str(error).split(" What to do:")[0].rstrip(".")
    return IPUOverflowError(
        f"{head}. This is the loss-scaled backward pass: the model trains "
        f"with loss scaling (LossScaleOptimizer, scale now {scale:g}), so "
        f"its gradients are computed {scale:g} times larger, and they "
        "overflow float16 although the data are fine. Keras' dynamic loss "
        "scale expects such overflows (it skips the step and halves the "
        "scale), but with floating_point_behaviour.oflo the IPU stops at "
        "the first one. Graphcore's half-precision guide: use the highest "
        "loss scale that does not overflow, found with the exceptions on. "
        "Fix: start from a lower scale, e.g. compile with optimizer="
        f"keras.optimizers.LossScaleOptimizer(<your optimizer>, "
        f"initial_scale={lower:g}) (every halving halves the gradients "
        "here), or stop trapping overflows "
        "(`config.floating_point_behaviour.oflo = False`, set_all = False) "
        "and let the dynamic scale lower itself.",
        primitive=error.primitive, source=error.source, count=error.count,
    )

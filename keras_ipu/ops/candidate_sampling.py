"""The default candidate sampler of nn_ops.nce_loss / sampled_softmax_loss
(sampled_values=None): TensorFlow's log_uniform_candidate_sampler, which
Graphcore's sampled losses call with unique=True.

TensorFlow's sampler (LogUniformCandidateSampler) has no XLA kernel, so a
compiled function cannot hold it. Inside a function the front end traces,
the sampler is an XLA custom call with a side effect, which the front end
imports as the device primitive log_uniform_candidates
(device/primitives/candidate_sampling.py: TensorFlow's algorithm and
expected counts, drawn from the device's random stream, which
utils.reset_ipu_seed reseeds). Outside one (eager TensorFlow, a plain
tf.function) it is TensorFlow's own sampler.
"""

from keras_ipu.ops import xla_custom_call

TARGET = "KerasIpuLogUniformCandidateSampler"


@xla_custom_call.import_rule(TARGET)
def _import(imp, instr, operands, config):
    from keras_ipu.device.primitives.candidate_sampling import log_uniform_candidates_p
    from keras_ipu.frontends.tensorflow.opcodes.effects import bind_effect

    (true_classes,) = operands
    sampled, true_expected, sampled_expected = bind_effect(
        imp, log_uniform_candidates_p, imp.array(true_classes),
        num_sampled=config["num_sampled"], unique=config["unique"],
        range_max=config["range_max"])
    return (sampled, true_expected, sampled_expected)


def log_uniform_candidate_sampler(true_classes, num_true, num_sampled, unique, range_max,
                                  seed=None):
    """(sampled_candidates, true_expected_count, sampled_expected_count) as
    tf.random.log_uniform_candidate_sampler returns them (see the module
    doc). On the IPU the draws follow the device's random stream: `seed`
    (TensorFlow's op seed) does not select them; reset_ipu_seed does."""
    import tensorflow as tf

    from keras_ipu.frontends.tensorflow.function import tracing_for_ipu

    if not tracing_for_ipu():
        return tf.random.log_uniform_candidate_sampler(
            true_classes, num_true, num_sampled, unique, range_max, seed=seed)
    true_classes = tf.cast(true_classes, tf.int64)
    if true_classes.shape.rank != 2 or true_classes.shape[1] != num_true:
        raise ValueError(
            f"true_classes must be [batch_size, num_true={num_true}], got shape "
            f"{true_classes.shape}.")
    sampled, true_expected, sampled_expected = xla_custom_call.emit(
        TARGET, [true_classes], [tf.int64, tf.float32, tf.float32],
        [[num_sampled], true_classes.shape.as_list(), [num_sampled]],
        {"num_sampled": int(num_sampled), "unique": bool(unique),
         "range_max": int(range_max)},
        has_side_effect=True)
    return sampled, true_expected, sampled_expected

"""An estimator's checkpoints in its model_dir, written so that a kill at
any moment leaves every checkpoint the directory names whole.

The files are TensorFlow's name-based checkpoint format (what TF1's Saver
and tf.estimator wrote: `model.ckpt-<step>.index` / `.data-*`, and the
`checkpoint` state file), so `tf.train.latest_checkpoint(model_dir)` and
`tf.train.load_checkpoint` read them. A save writes into a fresh hidden
directory, renames the finished files into model_dir, and only then
rewrites the `checkpoint` state file (TensorFlow writes it to a temporary
file and renames it). A run killed half way leaves at worst a hidden
directory or unnamed files, which the next estimator on that directory
removes; the state file always names complete checkpoints.
"""

import os
import shutil
import uuid

_TMP_PREFIX = ".tmp-ckpt-"
_BASENAME = "model.ckpt"


def remove_orphans(model_dir):
    """Remove what a killed save left behind."""
    if not os.path.isdir(model_dir):
        return
    for name in os.listdir(model_dir):
        if name.startswith(_TMP_PREFIX):
            shutil.rmtree(os.path.join(model_dir, name), ignore_errors=True)
    named = set(all_checkpoints(model_dir))
    for name in os.listdir(model_dir):
        if name.startswith(_BASENAME + "-"):
            prefix = os.path.join(model_dir, name.split(".index")[0].split(".data-")[0])
            if prefix not in named:
                os.remove(os.path.join(model_dir, name))


def latest(model_dir):
    import tensorflow as tf

    return tf.train.latest_checkpoint(model_dir)


def all_checkpoints(model_dir):
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(model_dir)
    if state is None:
        return []
    return [_absolute(model_dir, p) for p in state.all_model_checkpoint_paths]


def _absolute(model_dir, path):
    return path if os.path.isabs(path) else os.path.join(model_dir, path)


def save(model_dir, variables, global_step, keep_checkpoint_max=5):
    """Write `variables` ({name: tf.Variable}) as model.ckpt-<global_step>
    (see the module doc); returns its prefix."""
    import tensorflow as tf

    os.makedirs(model_dir, exist_ok=True)
    staging = os.path.join(model_dir, _TMP_PREFIX + uuid.uuid4().hex)
    os.makedirs(staging)
    name = f"{_BASENAME}-{int(global_step)}"
    names = sorted(variables)
    tf.raw_ops.SaveV2(
        prefix=os.path.join(staging, name), tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[variables[n].read_value() for n in names])
    # The index last: a reader finds a checkpoint by its index.
    files = sorted(os.listdir(staging), key=lambda f: f.endswith(".index"))
    for f in files:
        os.replace(os.path.join(staging, f), os.path.join(model_dir, f))
    os.rmdir(staging)
    prefix = os.path.join(model_dir, name)
    kept = [p for p in all_checkpoints(model_dir) if p != prefix] + [prefix]
    dropped, kept = (kept[:-keep_checkpoint_max], kept[-keep_checkpoint_max:]) \
        if keep_checkpoint_max else ([], kept)
    # TensorFlow's writer of the state file (temporary file + rename); the
    # public tf.compat.v1 wrapper is deprecated and cannot write relative paths.
    from tensorflow.python.checkpoint import checkpoint_management

    checkpoint_management.update_checkpoint_state_internal(
        model_dir, prefix, all_model_checkpoint_paths=kept, save_relative_paths=True)
    for old in dropped:
        for f in os.listdir(model_dir):
            if f.startswith(os.path.basename(old) + "."):
                os.remove(os.path.join(model_dir, f))
    return prefix


def restore(prefix, variables):
    """Assign each of `variables` ({name: tf.Variable}) its value in the
    checkpoint `prefix`; a variable the checkpoint lacks is an error
    naming it."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    stored = reader.get_variable_to_shape_map()
    missing = sorted(n for n in variables if n not in stored)
    if missing:
        raise ValueError(
            f"The checkpoint {prefix} has no value for {missing}: the model "
            "function makes variables the checkpoint was not written with. Use "
            "another model_dir, or the model function that wrote it.")
    for name, variable in variables.items():
        variable.assign(reader.get_tensor(name))

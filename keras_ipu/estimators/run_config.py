"""Graphcore's `ipu_run_config.IPURunConfig` and `RunConfig` (the
tf.estimator RunConfig, which TensorFlow 2.16 removed, with the IPU part)."""

import collections
import os
import tempfile

# tf.estimator.RunConfig's arguments and defaults (the ones this estimator
# reads are documented on RunConfig; the others are accepted and kept).
_ESTIMATOR_DEFAULTS = {
    "model_dir": None,
    "tf_random_seed": None,
    "save_summary_steps": 100,
    "save_checkpoints_steps": None,
    "save_checkpoints_secs": None,
    "session_config": None,
    "keep_checkpoint_max": 5,
    "keep_checkpoint_every_n_hours": 10000,
    "log_step_count_steps": 100,
    "train_distribute": None,
    "device_fn": None,
    "protocol": None,
    "eval_distribute": None,
    "experimental_distribute": None,
    "experimental_max_worker_delay_secs": None,
    "session_creation_timeout_secs": 7200,
    "checkpoint_save_graph_def": True,
}
_DEFAULT_CHECKPOINT_SECS = 600


class IPURunConfig(collections.namedtuple("IPURunConfig", (
        "iterations_per_loop", "ipu_options", "num_replicas", "num_shards", "ordinal",
        "prefetch_depth"))):
    """IPU options for an IPUEstimator: a namedtuple, as Graphcore's is
    (immutable, compared by value, `_replace`).

    Args:
      iterations_per_loop: training steps (or evaluation / prediction
        steps) in one executable run on the IPU; the host sees the results,
        runs the hooks and increments the global step once per loop.
      ipu_options: an `IPUConfig` configuring the IPU system; the
        estimator calls its `configure_ipu_system()`.
      num_replicas: replicas of the program (data parallelism).
      num_shards: IPUs the model is sharded over.
      ordinal: the device ordinal.
      prefetch_depth: the infeed's prefetch depth.
    """

    __slots__ = ()

    def __new__(cls, iterations_per_loop=1, ipu_options=None, num_replicas=1,
                num_shards=1, ordinal=0, prefetch_depth=None):
        for name, value in (("iterations_per_loop", iterations_per_loop),
                            ("num_replicas", num_replicas), ("num_shards", num_shards)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        _check_device_count(ipu_options, num_replicas, num_shards, ordinal)
        return super().__new__(cls, iterations_per_loop, ipu_options, num_replicas, num_shards,
                               ordinal, prefetch_depth)


def _check_device_count(ipu_options, num_replicas, num_shards, ordinal):
    """Graphcore's checks: the estimator's program needs num_replicas x
    num_shards IPUs, which the IPUConfig must select (with select_ipus the
    count is only known once the device exists: not checked here)."""
    num_devices = num_replicas * num_shards
    if num_devices > 1 and ipu_options is None:
        raise ValueError("IPU configuration requires more than one device, but "
                         "`ipu_options` is None")
    if ipu_options is None:
        return
    from keras_ipu.config import IPUConfig

    if not isinstance(ipu_options, IPUConfig):
        raise TypeError("ipu_options must be an IPUConfig instance.")
    auto = ipu_options.auto_select_ipus
    auto = list(auto) if isinstance(auto, (list, tuple)) else [auto]
    select = ipu_options.select_ipus
    select = list(select) if isinstance(select, (list, tuple)) else [select]
    devices = max(len(auto), len(select), 1)
    if ordinal >= devices:
        raise ValueError(f"Only {devices} device(s) available to choose from. "
                         f"You tried to pick a device at ordinal {ordinal}")
    configured = auto[ordinal] if ordinal < len(auto) else (num_devices if select else 1)
    if num_devices != configured:
        raise ValueError(
            f"`IPURunConfig` configured with {num_devices} devices ({num_replicas} "
            f"replicas times {num_shards} shards), but `ipu_options` configured with "
            f"{configured} devices")


class RunConfig:
    """tf.estimator's RunConfig with an `ipu_run_config`.

    Read by the estimator: `model_dir` (a temporary directory when None),
    `save_checkpoints_steps` / `save_checkpoints_secs` (at most one; 600
    seconds when neither is given; a checkpoint is also written at the end of
    every `train`), `keep_checkpoint_max`, `save_summary_steps`,
    `log_step_count_steps`, `tf_random_seed`. Steps are counted in whole
    loops of `iterations_per_loop`.
    """

    def __init__(self, ipu_run_config=None, master=None, **kwargs):
        unknown = sorted(set(kwargs) - set(_ESTIMATOR_DEFAULTS))
        if unknown:
            raise TypeError(f"RunConfig got unexpected keyword arguments {unknown}.")
        values = dict(_ESTIMATOR_DEFAULTS, **kwargs)
        if values["save_checkpoints_steps"] is not None and values["save_checkpoints_secs"] is not None:
            raise ValueError(
                "Can not provide both save_checkpoints_secs and save_checkpoints_steps.")
        if values["save_checkpoints_steps"] is None and values["save_checkpoints_secs"] is None:
            values["save_checkpoints_secs"] = _DEFAULT_CHECKPOINT_SECS
        for name, value in values.items():
            setattr(self, "_" + name, value)
        self.ipu_run_config = ipu_run_config or IPURunConfig()
        self.master = master

    def __getattr__(self, name):
        if name.startswith("_") or name not in _ESTIMATOR_DEFAULTS:
            raise AttributeError(name)
        return getattr(self, "_" + name)

    def replace(self, **kwargs):
        """A copy with `kwargs` changed (tf.estimator.RunConfig.replace)."""
        values = {k: getattr(self, "_" + k) for k in _ESTIMATOR_DEFAULTS}
        if kwargs.get("save_checkpoints_steps") is not None:
            values["save_checkpoints_secs"] = None
        ipu = kwargs.pop("ipu_run_config", self.ipu_run_config)
        values.update(kwargs)
        return RunConfig(ipu_run_config=ipu, master=self.master, **values)


def resolve_model_dir(model_dir, config):
    """The estimator's model_dir: the argument, else the config's, else a
    new temporary directory; both given and different is an error."""
    config_dir = getattr(config, "model_dir", None)
    if model_dir is not None and config_dir is not None and \
            os.path.abspath(model_dir) != os.path.abspath(config_dir):
        raise ValueError(
            "`model_dir` are set both in constructor and `RunConfig`, but with "
            f"different values. In constructor: '{model_dir}', in `RunConfig`: "
            f"'{config_dir}'.")
    chosen = model_dir or config_dir
    if chosen is None:
        chosen = tempfile.mkdtemp(prefix="ipu_estimator_")
    return os.fspath(chosen)

"""configure_ipu_system and friends: check an IPUConfig, then build the system.

Every check here is one a user can fail, so each message names the option,
its value, the rule and the fix.
"""

import copy
import dataclasses
import os
import threading

from keras_ipu.device import flags as poplar_flags
from keras_ipu.device.enums import DeviceConnectionType, StochasticRoundingBehaviour
from keras_ipu.device.config.ipu_config import IPUConfig
from keras_ipu.device.simulator import partition
from keras_ipu.device.simulator import system as sim
from keras_ipu.device.simulator import targets

_VERSIONS = tuple(targets.TARGETS)


def _require(ok, message):
    if not ok:
        raise ValueError(message)


def _check_selection(config):
    auto, explicit = config.auto_select_ipus, config.select_ipus
    has_auto = auto != [] and auto != ()
    has_explicit = explicit != [] and explicit != ()
    _require(
        not (has_auto and has_explicit),
        f"IPUConfig sets both auto_select_ipus ({auto!r}) and select_ipus ({explicit!r}): "
        "set only one of them.",
    )
    return auto if has_auto else explicit if has_explicit else None, has_explicit


def _check_connection(config):
    conn = config.device_connection
    _require(
        conn.version in ("",) + _VERSIONS,
        f"device_connection.version = {conn.version!r}: use one of "
        f"{', '.join(map(repr, _VERSIONS))} or '' (the default).",
    )
    needs_version = conn.type in (DeviceConnectionType.PRE_COMPILE, DeviceConnectionType.NEVER)
    _require(
        conn.version or not needs_version,
        f"device_connection.type = DeviceConnectionType.{conn.type.name} needs "
        "device_connection.version ('ipu1', 'ipu2' or 'ipu21'): there is no device "
        "to ask which IPU it is.",
    )


def _check_ipu_model(config, target):
    model = config.ipu_model
    _require(
        model.tiles_per_ipu >= 0,
        f"ipu_model.tiles_per_ipu = {model.tiles_per_ipu}: use 0 (all tiles) or a "
        "positive number of tiles.",
    )
    _require(
        model.tiles_per_ipu <= target.tiles_per_ipu,
        f"ipu_model.tiles_per_ipu = {model.tiles_per_ipu} exceeds the "
        f"{target.tiles_per_ipu} tiles of an {target.name} IPU: use at most "
        f"{target.tiles_per_ipu} (or 0 for all of them).",
    )


def _check_numbers(config, tiles):
    io = config.io_tiles
    _require(
        0 <= io.num_io_tiles < tiles,
        f"io_tiles.num_io_tiles = {io.num_io_tiles}: use 0 (no I/O tiles) up to "
        f"{tiles - 1} (an IPU here has {tiles} tiles and needs some for compute).",
    )
    _require(
        not io.place_ops_on_io_tiles or io.num_io_tiles > 0,
        "io_tiles.place_ops_on_io_tiles = True needs io_tiles.num_io_tiles > 0: "
        "reserve some I/O tiles first.",
    )
    _require(
        0.0 < io.available_memory_proportion <= 1.0,
        f"io_tiles.available_memory_proportion = {io.available_memory_proportion}: "
        "use a proportion in (0, 1].",
    )
    mrd = config.experimental.multi_replica_distribution
    _require(
        mrd.process_count >= 0,
        f"experimental.multi_replica_distribution.process_count = {mrd.process_count}: "
        "use 0 (off) or the number of processes.",
    )
    _require(
        mrd.process_count == 0 or 0 <= mrd.process_index < mrd.process_count,
        f"experimental.multi_replica_distribution.process_index = {mrd.process_index} "
        f"is not in [0, process_count = {mrd.process_count}).",
    )
    values = config.to_dict()
    for name in (
        "norms.experimental.distributed_batch_norm_replica_group_size",
        "scheduling.maximum_scheduler_lookahead_depth",
        "scheduling.maximum_scheduler_search_space_size",
    ):
        value = values[name]
        _require(value >= 1, f"{name} = {value}: use a value of at least 1.")
    for name, value in values.items():
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if name.startswith("optimizations.") and is_int:
            _require(value >= 0, f"{name} = {value}: use a value of at least 0.")
    for name, value in values.items():
        if name.endswith("poplar_options"):
            _check_poplar_options(name, value)


def _check_poplar_options(name, options):
    for key, value in options.items():
        _require(
            isinstance(key, str) and isinstance(value, (str, int, float, bool)),
            f"{name}: option {key!r}: {value!r} is not a Poplar option; use string "
            "names and string values, e.g. {'availableMemoryProportion': '0.3'}.",
        )
        if key == "availableMemoryProportion":
            try:
                proportion = float(value)
            except ValueError:
                proportion = -1.0
            _require(
                0.0 < proportion <= 1.0,
                f"{name}['availableMemoryProportion'] = {value!r}: use a proportion in (0, 1].",
            )


def _target_for(config, flags, default_model):
    # The ipu_model options are checked even when the model is not in use: a
    # bad value is a bug in the script either way.
    version = config.ipu_model.version
    _require(
        version in _VERSIONS,
        f"ipu_model.version = {version!r}: use one of {', '.join(map(repr, _VERSIONS))}.",
    )
    model_target = targets.get_target(version)
    _check_ipu_model(config, model_target)
    ipu_model = default_model or flags.use_ipu_model
    if not ipu_model:
        version = config.device_connection.version or targets.DEFAULT_TARGET
        return False, targets.get_target(version)
    tiles = config.ipu_model.tiles_per_ipu or flags.ipu_model_tiles
    _require(
        tiles <= model_target.tiles_per_ipu,
        f"--ipu_model_tiles={tiles} in TF_POPLAR_FLAGS exceeds the "
        f"{model_target.tiles_per_ipu} tiles of an {version} IPU.",
    )
    return True, model_target.with_tiles(tiles) if tiles else model_target


def _floating_point(config):
    fp = config.floating_point_behaviour
    if fp.set_all:
        on = StochasticRoundingBehaviour.ON
        return {"inv": True, "div0": True, "oflo": True, "nanoo": True, "esr": on}
    return {"inv": fp.inv, "div0": fp.div0, "oflo": fp.oflo, "nanoo": fp.nanoo, "esr": fp.esr}


def _check_combinations(config, ipu_model, explicit_selection):
    _require(
        not (ipu_model and explicit_selection),
        f"select_ipus = {config.select_ipus!r} with the IPU Model (--use_ipu_model): "
        "the IPU Model has no device listing; use auto_select_ipus instead.",
    )
    group = config.norms.experimental.distributed_batch_norm_replica_group_size
    _require(
        not (config.io_tiles.num_io_tiles > 0 and group > 1),
        f"norms.experimental.distributed_batch_norm_replica_group_size = {group} is not "
        f"supported with I/O tiles (io_tiles.num_io_tiles = "
        f"{config.io_tiles.num_io_tiles}): set one of them back to its default.",
    )
    mrd = config.experimental.multi_replica_distribution
    _require(
        not (ipu_model and mrd.process_count > 0),
        "experimental.multi_replica_distribution is not supported on the IPU Model: "
        "remove --use_ipu_model or set process_count = 0.",
    )


def _check_distribution(config):
    """multi_replica_distribution must describe the processes MPI launched."""
    mrd = config.experimental.multi_replica_distribution
    if mrd.process_count == 0:
        return
    job = partition.current()
    _require(
        (mrd.process_count, mrd.process_index) == (job.num_instances, job.instance_index),
        f"experimental.multi_replica_distribution.process_count = {mrd.process_count} and "
        f"process_index = {mrd.process_index}, but this process is instance "
        f"{job.instance_index} of {job.num_instances} launched by MPI. Launch "
        f"{mrd.process_count} processes (python -m keras_ipu.poprun --num-instances "
        f"{mrd.process_count} ..., or mpirun -np {mrd.process_count} ...) and let "
        "keras_ipu.popdist.tensorflow.set_ipu_config set both values.",
    )


def build_system(config, flags=None, pod=None, default=False):
    """Check `config` and make the IPUSystem it describes (not installed)."""
    if not isinstance(config, IPUConfig):
        raise TypeError(
            f"configure_ipu_system expects an IPUConfig, got {type(config).__name__}. "
            "Build one with keras_ipu.config.IPUConfig() (IpuOptions protobufs are "
            "not supported)."
        )
    flags = poplar_flags.read_flags() if flags is None else flags
    # A process of a poprun/mpirun job sees the Pod of the whole job.
    pod = sim.Pod(partition.current().pod_size) if pod is None else pod
    selection, explicit = _check_selection(config)
    _check_connection(config)
    ipu_model, target = _target_for(config, flags, default)
    _check_numbers(config, target.tiles_per_ipu)
    _check_combinations(config, ipu_model and not default, explicit)
    _check_distribution(config)
    if flags.executable_cache_path:
        _require(
            not os.path.isfile(flags.executable_cache_path),
            f"--executable_cache_path={flags.executable_cache_path} in TF_POPLAR_FLAGS "
            "is a file: give a directory.",
        )
    if selection is None:
        devices = sim.auto_select(pod, 1)  # nothing selected: one device of one IPU
    elif explicit:
        devices = sim.select(pod, selection)
    else:
        devices = sim.auto_select(pod, selection)
    return sim.IPUSystem(
        config=copy.deepcopy(config),
        flags=flags,
        pod=pod,
        target=target,
        ipu_model=ipu_model,
        devices=devices,
        connection=config.device_connection.type,
        num_io_tiles=config.io_tiles.num_io_tiles,
        floating_point=_floating_point(config),
        is_default=default,
    )


def default_system(flags=None):
    """The system used when nothing is configured: one ipu2 IPU Model (DESIGN
    decision 2), with TF_POPLAR_FLAGS (`flags`: read now when None)."""
    return build_system(IPUConfig(), flags=flags, default=True)


# -- the configured system: one answer for everyone ------------------------------
# The process-global system. None until configured or first asked for
# (current_system); then the default of DESIGN decision 2 is made on demand.
_lock = threading.RLock()
_current = None


def configured_system():
    """The installed system, or None: never makes one (compiling must not
    fix the system: a script may still configure it or set flags)."""
    return _current


def current_system():
    """The installed system; the default one is made and installed when
    nothing is configured (what reset_ipu_seed and the device listing act on)."""
    global _current
    with _lock:
        if _current is None:
            _current = default_system()
        return _current


def install_system(system):
    global _current, _memo
    with _lock:
        _current = system
        _memo = (_NONE, None, None)


def configured_instances():
    """(process count, process index) of the job's instances whose replicas
    all-reduce together, for the current system (partition.py)."""
    return partition.configured_instances(current_system())


def has_configured_system():
    return _current is not None and not _current.is_default


@dataclasses.dataclass(frozen=True)
class Configuration:
    """What the IPU system is now, as the compiler, the memory model and the
    cycle prediction see it."""

    target: object  # IPUTarget, per IPU
    flags: object  # PoplarFlags in force
    fp_behaviour: object  # numerics' FPBehaviour (DEFAULT_BEHAVIOUR: all off)
    ipu_model: bool
    connection: DeviceConnectionType
    system: object  # the installed IPUSystem, or None (nothing installed yet)
    # IPUConfig.allow_recompute: recomputation CONFIGURED means Auto.
    allow_recompute: bool = False


_NONE = object()
# (system it was made for, TF_POPLAR_FLAGS text, Configuration): one entry
# is enough, the system changes rarely; jit asks on every call.
_memo = (_NONE, None, None)


def configuration():
    """The Configuration of the installed system or, when none is installed,
    of the default one TF_POPLAR_FLAGS describe now (made to answer, not
    installed: flags set later in the script still apply, as on the IPU).
    The same object comes back while nothing changes."""
    global _memo
    current = _current
    memo_system, memo_env, answer = _memo
    if current is not None:
        if memo_system is current:
            return answer
        env = None
        system = current
    else:
        env = os.environ.get(poplar_flags.ENV_VAR)
        if memo_system is None and memo_env == env:
            return answer
        system = default_system(poplar_flags.read_flags(print_help=False))
    answer = Configuration(
        target=system.target, flags=system.flags, fp_behaviour=system.fp_behaviour,
        ipu_model=system.ipu_model, connection=system.connection, system=current,
        allow_recompute=bool(getattr(system.config, "allow_recompute", False)),
    )
    _memo = (current, env, answer)
    return answer


def configure_ipu_system(config, device="cpu", reset_configuration=True):
    """Configure the IPU system with an IPUConfig.

    TF_POPLAR_FLAGS is read now. `device` (the host CPU device) is accepted
    for compatibility. With reset_configuration=False, configuring a system
    that is already configured is an error, as on the IPU.
    """
    if not reset_configuration and has_configured_system():
        raise RuntimeError(
            "The IPU system is already configured and reset_configuration=False: call "
            "reset_ipu_configuration() first or pass reset_configuration=True."
        )
    system = build_system(config)
    install_system(system)
    return system


# IPUConfig.configure_ipu_system(device) is this function, registered on the
# class here (the config declares the options; configuring builds on it).
IPUConfig.configure_ipu_system = configure_ipu_system


def reset_ipu_configuration():
    """Forget the configured system; the default one (an ipu2 IPU Model) returns."""
    install_system(None)


def get_ipu_config(session=None):
    """A copy of the IPUConfig of the current system (the default one if none)."""
    return copy.deepcopy(current_system().config)


def get_system():
    """The current IPUSystem (the default one if nothing is configured)."""
    return current_system()

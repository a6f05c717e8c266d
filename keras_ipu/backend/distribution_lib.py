"""keras.distribution on the ipu backend: the devices are the IPUs.

Keras' distribution API (keras/src/distribution/distribution_lib.py) asks
its backend for the devices, the processes of the job and how to lay a
tensor out on a DeviceMesh. On the ipu backend:

- the devices are the IPUs of the device Keras models run on
  (/device:IPU:0 of the configured system, as IPUStrategy's default):
  `list_devices()` is ["ipu:0", ..., "ipu:N-1"] (one IPU Model by default,
  `IPUConfig.auto_select_ipus = N` for N), and ["cpu:0"] is the host;
- the processes are the MPI processes of the job (poprun / mpirun launch
  them, DESIGN decision 9): `initialize` checks what Keras was told
  against what the launcher says, it starts nothing. Each process lists
  its own IPUs (the device poprun gave it), not the job's as JAX lists
  every host's: a DeviceMesh covers one process's IPUs, so a model axis
  lies within a process, and the replicas of all the processes train as
  one data-parallel job (distribute/keras_distribution.py);
- `DataParallel` is replication: a model made while a distribution is set
  gets the IPU extensions of a strategy on that device
  (keras_ipu/distribute/keras_distribution.py), so `fit` runs one replica
  per IPU of the mesh, exactly as IPUStrategy's replication;
- `ModelParallel` with a model axis of k > 1 IPUs is tensor parallelism:
  each replica (the mesh's batch axis) spans k consecutive IPUs, and a
  weight whose layout splits a dimension over the model axis lives 1/k
  on each of them; the program's operations are partitioned to match,
  with collectives between the IPUs (device/compiler/tensor_parallel.py,
  GSPMD's propagation as Keras' JAX backend would get it). Graphcore's
  SDK has no tensor parallelism in TensorFlow 2: this is keras_ipu's own.
  One model axis is supported: a weight split over two mesh axes, or a
  weight split over the batch axis (its replicas), raises
  NotImplementedError (`weight_split`). Layouts of activations
  (LayoutMap entries for layer outputs) are not constraints here: the
  partition follows from the weights' layouts.

Values live on the host either way (the simulator's IPUs share one copy of
each variable, broadcast to every replica when a program starts; a split
weight changes the prediction of each IPU's memory and cycles, not the
arithmetic), so the `distribute_*` functions return their input after
checking its layout.
"""

import re

_DEVICE = re.compile(r"^(ipu|cpu):(\d+)$")

SPLIT_AXES_REASON = (
    "keras_ipu splits a weight over one mesh axis (the model axis: tensor "
    "parallelism within each replica, device/compiler/tensor_parallel.py); "
    "splitting it over several axes, or over the batch axis whose IPUs are the "
    "replicas (each replica holds whole weights, as Graphcore's replication "
    "does), is not implemented. Lay the weight out over the model axis only, "
    "e.g. (None, 'model')."
)


def _model_device():
    """The IPU device Keras models run on (IPUStrategy's default)."""
    from keras_ipu.device.config import system_config

    return system_config.current_system().device("/device:IPU:0")


def _device_type(device_type):
    kind = "ipu" if device_type is None else str(device_type).lower()
    if kind not in ("ipu", "cpu"):
        raise ValueError(
            f"device_type={device_type!r}: the ipu backend has 'ipu' devices (the IPUs "
            "of the configured system) and one 'cpu' device (the host); use one of those."
        )
    return kind


def list_devices(device_type=None):
    """The devices of `device_type` ("ipu", the default, or "cpu") as
    "type:index" strings: the IPUs of the device models run on, or the host."""
    if _device_type(device_type) == "cpu":
        return ["cpu:0"]
    return [f"ipu:{i}" for i in range(_model_device().num_ipus)]


def get_device_count(device_type=None):
    """How many devices `list_devices(device_type)` lists."""
    return len(list_devices(device_type))


def _mpi_rank_and_size():
    from keras_ipu.device.simulator import partition

    return partition.mpi_rank_and_size()


def num_processes():
    """The processes of the job (the MPI launcher's size; 1 alone)."""
    return _mpi_rank_and_size()[1]


def process_id():
    """This process's index in the job (its MPI rank; 0 alone)."""
    return _mpi_rank_and_size()[0]


def initialize(job_addresses, num_processes=None, process_id=None):
    """Keras' multi-process set-up. On the IPU the processes are launched
    by poprun / mpirun, which already tells each one its rank and the job's
    size: this checks that what Keras was given agrees (a process started
    by hand with other numbers would wait forever on the collectives)."""
    del job_addresses  # MPI's launcher connects the processes, not addresses
    rank, size = _mpi_rank_and_size()
    if num_processes is not None and int(num_processes) != size:
        raise ValueError(
            f"keras.distribution.initialize(num_processes={num_processes}) but this "
            f"process was launched as one of {size} (its MPI launcher's size). On the "
            "ipu backend launch the processes with poprun or mpirun -np N, and pass "
            "num_processes=N or None."
        )
    if process_id is not None and int(process_id) != rank:
        raise ValueError(
            f"keras.distribution.initialize(process_id={process_id}) but this process "
            f"has MPI rank {rank}. Pass process_id=None: the launcher numbers the "
            "processes."
        )


def _ipu_index(device):
    device = str(device)  # a mesh holds NumPy strings
    match = _DEVICE.match(device.strip().lower())
    if match is None:
        raise ValueError(
            f"Device {device!r} is not a device of the ipu backend: use the names "
            f"keras.distribution.list_devices() gives ({', '.join(list_devices())})."
        )
    kind, index = match.group(1), int(match.group(2))
    known = list_devices(kind)
    if f"{kind}:{index}" not in known:
        raise ValueError(
            f"Device {device!r} is not in the configured system, whose {kind} devices "
            f"are {', '.join(known)}. Select more IPUs with "
            "IPUConfig.auto_select_ipus before making the DeviceMesh."
        )
    return index


def _to_backend_mesh(device_mesh):
    """The mesh as an array of IPU indices (its shape), each checked to be
    an IPU of the configured system."""
    import numpy as np

    indices = [_ipu_index(d) for d in device_mesh.devices.flatten()]
    return np.asarray(indices, dtype=np.int64).reshape(device_mesh.devices.shape)


def mesh_axis_sizes(device_mesh):
    """{axis name: size} of a DeviceMesh."""
    return dict(zip(device_mesh.axis_names, device_mesh.shape))


def model_axes(device_mesh, batch_dim_name):
    """{axis: size} of the mesh axes other than the batch with more than
    one IPU: the axes a weight may be split over."""
    return {a: n for a, n in mesh_axis_sizes(device_mesh).items()
            if a != batch_dim_name and n > 1}


def weight_split(tensor_layout, what, batch_dim_name):
    """(dimension, mesh axis, IPUs) of the one dimension a weight's layout
    splits over the model axis, or None when it is replicated;
    NotImplementedError for splits keras_ipu does not do (SPLIT_AXES_REASON)."""
    if tensor_layout is None or tensor_layout.device_mesh is None:
        return None
    sizes = mesh_axis_sizes(tensor_layout.device_mesh)
    split = [(d, a) for d, a in enumerate(tensor_layout.axes)
             if a is not None and sizes.get(a, 1) > 1]
    if not split:
        return None
    if len(split) > 1 or split[0][1] == batch_dim_name:
        dims = ", ".join(f"dimension {d} over '{a}' ({sizes[a]} IPUs)" for d, a in split)
        raise NotImplementedError(
            f"{what} has the layout {tuple(tensor_layout.axes)}, which splits {dims}: "
            + SPLIT_AXES_REASON)
    (dim, axis), = split
    return dim, axis, sizes[axis]


def _to_backend_layout(tensor_layout):
    """The layout, its mesh checked to be IPUs of the configured system."""
    if tensor_layout.device_mesh is None:
        raise ValueError(
            "Cannot create sharding when device mesh is not set for TensorLayout."
        )
    _to_backend_mesh(tensor_layout.device_mesh)
    return tensor_layout


def _batch_dim_name():
    from keras.src.distribution import distribution_lib

    distribution = distribution_lib.distribution()
    return None if distribution is None else distribution.batch_dim_name


def _layout_of(layout):
    from keras.src.distribution import TensorLayout

    if isinstance(layout, TensorLayout):
        return layout.backend_layout
    raise ValueError(
        f"layout={layout!r}: the ipu backend takes a keras.distribution.TensorLayout."
    )


def distribute_variable(value, layout):
    """`value` (its layout checked): the replicas share one copy; a split
    over the model axis is read by the compiler (tensor_parallel.py)."""
    weight_split(_layout_of(layout), "A variable", _batch_dim_name())
    return value


def distribute_tensor(tensor, layout):
    """`tensor` (its layout checked): in a replicated program each replica
    already holds its share of the batch, and activations are split as the
    weights they come from (tensor_parallel.py), not by their layout."""
    _layout_of(layout)
    return tensor


def distribute_data_input(per_process_batch, layout, batch_dim_name):
    """The process's batch (its layout checked): the infeed deals it to the
    replicas (keras_ipu/distribute/keras_distribution.py)."""
    del batch_dim_name
    _layout_of(layout)
    return per_process_batch

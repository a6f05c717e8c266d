"""keras_ipu.utils: the general utilities of tensorflow.python.ipu.utils:
the IPU system (device sizes, IPU Model, seeds, synthetic data) and the
export of infeed data to binary files (TensorFlow, imported when used).
"""

import numbers

from keras_ipu.device.flags import SyntheticDataCategory  # noqa: F401 (public name)
from keras_ipu.device.config.system_config import current_system as _system


def get_num_of_ipus_in_device(ipu_device, device="cpu"):
    """The number of physical IPUs of a configured device ("/device:IPU:0")."""
    return _system().device(ipu_device).num_ipus


def running_on_ipu_model():
    """True when the system is the IPU Model (the default, or --use_ipu_model)."""
    return _system().ipu_model


def reset_ipu_seed(
    seed, device="/device:IPU:0", cpu_device="cpu", experimental_identical_replicas=False
):
    """Reset the seed of stateful random numbers and stochastic rounding on `device`.

    The executor seeds the device's random state from it on its next run.
    """
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"reset_ipu_seed: seed must be an integer, got {seed!r}.")
    system = _system()
    ipu = system.device(device)
    system.seeds[ipu.index] = (int(seed), bool(experimental_identical_replicas))


def use_synthetic_data_for(synthetic_data_category):
    """Whether data of the given SyntheticDataCategory is synthetic (TF_POPLAR_FLAGS)."""
    return _system().flags.synthetic_data_for(synthetic_data_category)


def move_variable_initialization_to_cpu(graph=None):
    """No-op: there are no TF1 graph collections; variables start on the host anyway."""


def device_listing():
    """The simulated Pod's device listing, in the format of `gc-info -l`."""
    return _system().pod.listing()


def export_dataset_to_file(dataset_or_infeed, output_filename, num_elements,
                           feed_name="", apply_options=True):
    """Export `num_elements` elements of a dataset or IPUInfeedQueue as binary
    files (one per element component); see
    keras_ipu/frontends/tensorflow/dataset_export.py for the format."""
    from keras_ipu.frontends.tensorflow import dataset_export

    return dataset_export.export_dataset_to_file(
        dataset_or_infeed, output_filename, num_elements, feed_name, apply_options)


def export_inputs_to_file(inputs, output_filename, feed_dict):
    """Export the values of `inputs` (feed_dict values first) as binary files."""
    from keras_ipu.frontends.tensorflow import dataset_export

    return dataset_export.export_inputs_to_file(inputs, output_filename, feed_dict)

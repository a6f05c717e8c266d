"""strategy.extended of the multi-process strategies: the reference's
constructor arguments, and those keras_ipu refuses (before MPI starts, so
these run in the test process; read_var over instances is checked by the
launched jobs of test_multiprocess.py)."""

import warnings

import keras
import pytest

from keras_ipu import ipu_multi_worker_strategy
from keras_ipu.distributed import extended
from keras_ipu.distributed import ipu_horovod_strategy
from keras_ipu.distributed import popdist_strategy


def test_popdist_without_cross_replica_reductions_is_refused():
    with pytest.raises(NotImplementedError, match="add_ipu_cross_replica_reductions=False"):
        popdist_strategy.PopDistStrategy(add_ipu_cross_replica_reductions=False)


@pytest.mark.parametrize("make", [
    lambda: ipu_horovod_strategy.IPUHorovodStrategy(variables_on_host=True),
    lambda: ipu_multi_worker_strategy.IPUMultiWorkerStrategy(None, variables_on_host=True),
])
def test_variables_on_host_is_refused(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(NotImplementedError, match="variables_on_host=True"):
            make()


def test_extended_classes_take_the_reference_arguments():
    strategy = object()
    e = extended.PopDistExtendedV1(strategy, None, "/device:IPU:0", add_ipu_cross_replica_reductions=True)
    assert e._strategy is strategy and e._ipu_device == "/device:IPU:0"
    h = extended.IPUHorovodExtended(strategy, None, "/device:IPU:0", variables_on_host=False)
    assert isinstance(h, extended.IPUMultiWorkerExtended)
    # Graphcore's PopDistExtendedV1 derives from the multi-worker one too.
    assert isinstance(e, extended.IPUMultiWorkerExtended)


def test_read_var_of_a_variable_synced_on_write_is_its_value():
    e = extended.PopDistExtendedV1(object(), None, "/device:IPU:0", True)
    v = keras.Variable(3.0)
    assert float(e.read_var(v)) == 3.0


def test_read_var_of_a_sync_on_read_variable_without_aggregation_says_why():
    e = extended.PopDistExtendedV1(object(), None, "/device:IPU:0", True)
    v = keras.Variable(1.0, synchronization="on_read", aggregation="none", name="counter")
    with pytest.raises(ValueError, match="'counter'.*aggregation is 'none'"):
        e.read_var(v)


@pytest.mark.parametrize("module", [popdist_strategy, ipu_multi_worker_strategy])
def test_variable_wrappers_are_unavailable_with_a_reason(module):
    for name in ("IPUMirroredVariable", "IPUSyncOnReadVariable"):
        with pytest.raises(NotImplementedError, match="no per-replica variable objects"):
            getattr(module, name)()

"""The cost model's reductions between replicas, processes and Pods
(cost_model.py, "reductions between processes and between Pods"), checked
against hand computations from the stated constants."""

import logging
import math

import pytest

from keras_ipu.device.simulator import cost_model as c
from keras_ipu.device.simulator import prediction, targets

IPU2 = targets.get_target("ipu2")


def test_network_ring_is_2_p_minus_1_steps_of_n_over_p():
    # p = 4: 6 steps of 10 us, each participant sending 6/4 x 1000 B at 1000 B/s.
    assert c.network_allreduce_seconds(1000, 4, 1e3) == pytest.approx(6 * 10e-6 + 1.5)
    assert c.network_allreduce_seconds(1000, 1, 1e3) == 0.0
    assert c.network_allreduce_seconds(0, 8, 1e3) == 0.0


def test_gateway_links_of_a_pod64():
    # 16 machines x 2 GW-Links x 12.5 GB/s = 400 GB/s per Pod; 2 Pods: 2 steps
    # of 10 us + 200 MB each.
    assert c.gateway_allreduce_seconds(400e6, 2) == pytest.approx(2 * 10e-6 + 2 * 200e6 / 400e9)


def test_host_allreduce_is_two_host_transfers_and_a_ring_over_100gbe():
    pcie = 5e-6 + 64e6 / 32e9  # one way over PCIe Gen4 x16 (32 GB/s) with its latency
    ring = 2 * 10e-6 + 2 * 32e6 / 12.5e9  # 2 instances: 2 steps of half the tensor
    assert c.host_allreduce_seconds(64e6, 2, IPU2) == pytest.approx(2 * pcie + ring)
    assert c.host_allreduce_seconds(64e6, 1, IPU2) == 0.0


def test_ipu_link_ring_is_the_compiled_collective_cost():
    # ipu2: 320 GB/s of IPU-Links; 4 replicas: 6 steps, 6/4 x 64 MB sent, a
    # 900-cycle inter-IPU sync per step (cost_model.all_reduce_link_traffic).
    link = math.ceil(1.5 * 64e6 / 320e9 * 1.33e9)
    expected = (link + 6 * 900) / 1.33e9
    assert c.ipu_link_allreduce_seconds(64e6, 4, IPU2) == pytest.approx(expected)


def test_data_parallel_reduction_crosses_pods_beyond_64_ipus():
    n = 50e6
    inside = c.data_parallel_reduction_seconds(n, 64, IPU2)
    assert inside == pytest.approx(c.ipu_link_allreduce_seconds(n, 64, IPU2))
    across = c.data_parallel_reduction_seconds(n, 256, IPU2)
    assert across == pytest.approx(
        c.ipu_link_allreduce_seconds(n, 64, IPU2) + c.gateway_allreduce_seconds(n, 4, 64)
    )
    # Replicas of 4 IPUs: 16 of them fill a Pod64.
    assert c.data_parallel_reduction_seconds(n, 32, IPU2, ipus_per_replica=4) == pytest.approx(
        c.ipu_link_allreduce_seconds(n, 16, IPU2) + c.gateway_allreduce_seconds(n, 2, 64)
    )
    assert c.data_parallel_reduction_seconds(n, 1, IPU2) == 0.0


def test_host_allreduce_prediction_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
        result = prediction.predict_host_allreduce(64e6, 2, IPU2, log=True)
    assert result.seconds == pytest.approx(c.host_allreduce_seconds(64e6, 2, IPU2))
    assert result.transfer_seconds == pytest.approx(2 * (5e-6 + 64e6 / 32e9))
    assert "host all-reduce of 64,000,000 B over 2 instances" in caplog.text


@pytest.mark.parametrize("on_hosts", [False, True])
def test_collective_of_a_multi_process_job_costs_the_instances_part(monkeypatch, on_hosts):
    from keras_ipu.device.ir import ShapedArray
    from keras_ipu.device.primitives import collective
    from keras_ipu.device.simulator import partition

    x = ShapedArray((1_000_000,), "float32")
    record = collective.cross_replica_mean_p.cost([x], [x], replicas=2, group_size=2)
    alone = prediction.cycles(record, IPU2)
    monkeypatch.setattr(partition, "configured_instances", lambda system=None: (4, 1))
    monkeypatch.setattr(partition, "reduces_on_hosts", lambda: on_hosts)
    together = prediction.cycles(record, IPU2)
    extra = c.cross_instance_reduction_seconds(4e6, 2, 4, IPU2, on_hosts=on_hosts)
    assert together[1] - alone[1] == math.ceil(extra * IPU2.clock_hz)
    if on_hosts:  # Horovod: the local result through the hosts' ring
        assert extra == pytest.approx(c.host_allreduce_seconds(4e6, 4, IPU2))
    else:  # GCL: the ring over all 8 replicas instead of the 2 local ones
        assert extra == pytest.approx(
            c.ipu_link_allreduce_seconds(4e6, 8, IPU2) - c.ipu_link_allreduce_seconds(4e6, 2, IPU2)
        )

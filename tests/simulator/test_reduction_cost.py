"""The cost model's reductions between replicas, processes and Pods
(cost_model.py, "reductions between processes and between Pods"), checked
against hand computations from the stated constants."""

import logging

import pytest

from keras_ipu.device.simulator import cost_model as c
from keras_ipu.device.simulator import prediction, targets

IPU2 = targets.get_target("ipu2")


def test_ring_allreduce_is_2_p_minus_1_steps_of_n_over_p():
    # p = 4: 6 steps of 0.1 s latency and 250 B at 1000 B/s.
    assert c.ring_allreduce_seconds(1000, 4, 1e3, 0.1) == pytest.approx(0.6 + 1.5)
    assert c.ring_allreduce_seconds(1000, 1, 1e3, 0.1) == 0.0
    assert c.ring_allreduce_seconds(0, 8, 1e3, 0.1) == 0.0


def test_gateway_links_of_a_pod64():
    # 16 machines x 2 GW-Links x 12.5 GB/s = 400 GB/s per Pod; 2 Pods: 2 steps
    # of 10 us + 200 MB each.
    assert c.gateway_allreduce_seconds(400e6, 2) == pytest.approx(2 * 10e-6 + 2 * 200e6 / 400e9)


def test_host_allreduce_is_two_host_transfers_and_a_ring_over_100gbe():
    pcie = 5e-6 + 64e6 / 32e9  # one way over PCIe Gen4 x16 (32 GB/s) with its latency
    ring = 2 * 10e-6 + 2 * 32e6 / 12.5e9  # 2 instances: 2 steps of half the tensor
    assert c.host_allreduce_seconds(64e6, 2, IPU2) == pytest.approx(2 * pcie + ring)
    assert c.host_allreduce_seconds(64e6, 1, IPU2) == 0.0


def test_host_allreduce_prediction_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="keras_ipu.cycles"):
        result = prediction.predict_host_allreduce(64e6, 2, IPU2, log=True)
    assert result.seconds == pytest.approx(c.host_allreduce_seconds(64e6, 2, IPU2))
    assert result.transfer_seconds == pytest.approx(2 * (5e-6 + 64e6 / 32e9))
    assert "host all-reduce of 64,000,000 B over 2 instances" in caplog.text

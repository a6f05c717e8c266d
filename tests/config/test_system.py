"""The simulated Pod, device selection, SelectionOrder and configure_ipu_system."""

import pytest

from keras_ipu import config as ipu_config
from keras_ipu import utils as ipu_utils
from keras_ipu.config import DeviceConnectionType, IPUConfig, SelectionOrder
from keras_ipu.device.config import get_system
from keras_ipu.device.config import system_config
from keras_ipu.device.simulator import system as sim
from keras_ipu.device.simulator import targets

# The reference's `gc-info -l` listing for 16 IPUs: multi-IPU device id ->
# member PCIe ids in DNC order, copied by hand.
REFERENCE_MULTI_IPU = {
    16: [5, 7], 17: [4, 6], 18: [3, 1], 19: [2, 0],
    20: [13, 15], 21: [12, 14], 22: [9, 11], 23: [10, 8],
    24: [5, 7, 4, 6], 25: [3, 1, 2, 0], 26: [13, 15, 12, 14], 27: [9, 11, 10, 8],
    28: [5, 7, 4, 6, 3, 1, 2, 0], 29: [13, 15, 12, 14, 9, 11, 10, 8],
    30: [5, 7, 4, 6, 3, 1, 2, 0, 13, 15, 12, 14, 9, 11, 10, 8],
}  # fmt: skip

REFERENCE_LISTING_HEAD = """\
Graphcore device listing:

-+- Id:  [0], type:      [PCIe], PCI Domain: [0000:1a:00.0]
-+- Id:  [1], type:      [PCIe], PCI Domain: [0000:1b:00.0]"""

REFERENCE_LISTING_TAIL = """\
-+- Id: [23], type: [Multi IPU]
|--- PCIe Id: [10], DNC Id: [0], PCI Domain: [0000:8e:00.0]
|--- PCIe Id:  [8], DNC Id: [1], PCI Domain: [0000:8b:00.0]"""

# The reference's 16-IPU diagram: selection order -> IPU (ladder position) per shard.
DIAGRAM_ORDERS = {
    SelectionOrder.ZIGZAG: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    SelectionOrder.SNAKE: [0, 1, 3, 2, 4, 5, 7, 6, 8, 9, 11, 10, 12, 13, 15, 14],
    SelectionOrder.HOOF: [0, 2, 4, 6, 8, 10, 12, 14, 15, 13, 11, 9, 7, 5, 3, 1],
}


def test_pod_matches_reference_listing():
    pod = sim.Pod()
    assert len(pod.configurations) == 31
    for i in range(16):
        assert pod.configurations[i].ipus == (i,)
    for dev_id, members in REFERENCE_MULTI_IPU.items():
        assert list(pod.configurations[dev_id].ipus) == members, dev_id
    listing = pod.listing()
    assert listing.startswith(REFERENCE_LISTING_HEAD)
    assert REFERENCE_LISTING_TAIL in listing
    assert listing.count("type: [Multi IPU]") == 15


@pytest.mark.parametrize("order", list(DIAGRAM_ORDERS))
def test_selection_orders_match_diagram(order):
    assert list(sim.shard_order(order, 16)) == DIAGRAM_ORDERS[order]


def test_selection_orders_on_smaller_devices():
    assert sim.shard_order(SelectionOrder.SNAKE, 4) == (0, 1, 3, 2)
    assert sim.shard_order(SelectionOrder.HOOF, 4) == (0, 2, 3, 1)
    assert sim.shard_order(SelectionOrder.HOOF, 8) == (0, 2, 4, 6, 7, 5, 3, 1)
    for order in SelectionOrder:
        assert sim.shard_order(order, 2) == (0, 1)
        assert sim.shard_order(order, 1) == (0,)
    assert sim.shard_order(SelectionOrder.AUTO, 8) == sim.shard_order(SelectionOrder.SNAKE, 8)
    assert sim.shard_order(SelectionOrder.AUTO, 8, ring=True) == sim.shard_order(
        SelectionOrder.HOOF, 8
    )


def test_links_explain_the_orders():
    pod = sim.Pod()
    full = pod.configurations[30]

    def ipus(order):
        return [full.ipus[p] for p in sim.shard_order(order, 16)]

    zigzag, snake, hoof = (ipus(o) for o in DIAGRAM_ORDERS)
    # As the reference says: shards 1 and 2 on IPUs 1 and 2 need a hop ...
    assert not pod.linked(zigzag[1], zigzag[2])
    # ... SNAKE and HOOF link every consecutive pair, HOOF also last to first.
    assert all(pod.linked(a, b) for a, b in zip(snake, snake[1:]))
    assert all(pod.linked(a, b) for a, b in zip(hoof, hoof[1:]))
    assert pod.linked(hoof[-1], hoof[0]) and not pod.linked(snake[-1], snake[0])


def test_device_shard_ipus():
    cfg = IPUConfig()
    cfg.select_ipus = [24]
    ipu_config.configure_ipu_system(cfg)
    device = get_system().device("/device:IPU:0")
    assert device.ipus == (5, 7, 4, 6)
    assert device.shard_ipus(SelectionOrder.ZIGZAG) == (5, 7, 4, 6)
    assert device.shard_ipus(SelectionOrder.SNAKE) == (5, 7, 6, 4)
    assert device.shard_ipus(SelectionOrder.HOOF, num_shards=3) == (5, 4, 6)
    with pytest.raises(ValueError, match="5 shards do not fit on /device:IPU:0"):
        device.shard_ipus(SelectionOrder.SNAKE, num_shards=5)


@pytest.mark.parametrize(
    "request_,expected",
    [
        (1, [[0]]),
        ([2, 2], [[5, 7], [4, 6]]),
        ([1, 2], [[0], [5, 7]]),
        # Largest first, then first fit: the 8 takes device 28, the 1 the first free IPU.
        ([1, 8], [[8], REFERENCE_MULTI_IPU[28]]),
        ([4, 4, 4, 4], [REFERENCE_MULTI_IPU[i] for i in (24, 25, 26, 27)]),
        ((16,), [REFERENCE_MULTI_IPU[30]]),
        ([1] * 8 + [8], [[i] for i in range(8, 16)] + [REFERENCE_MULTI_IPU[28]]),
    ],
)
def test_auto_select(request_, expected):
    cfg = IPUConfig()
    cfg.auto_select_ipus = request_
    cfg.configure_ipu_system()
    system = get_system()
    assert [list(d.ipus) for d in system.devices] == expected
    assert [d.name for d in system.devices] == [f"/device:IPU:{i}" for i in range(len(expected))]
    for i, members in enumerate(expected):
        assert ipu_utils.get_num_of_ipus_in_device(f"/device:IPU:{i}") == len(members)
        assert system.device(f"/job:localhost/replica:0/task:0/device:IPU:{i}").index == i
        assert system.device(f"IPU:{i}") is system.device(i)
    with pytest.raises(ValueError, match="No IPU device '/device:CPU:0'"):
        system.device("/device:CPU:0")


def test_select_ipus_reference_examples():
    for selection, expected in [
        (0, [[0]]),
        (8, [[8]]),
        ([0, 1], [[0], [1]]),
        ([24, 25], [[5, 7, 4, 6], [3, 1, 2, 0]]),
        ([0, 1, 2, 3], [[0], [1], [2], [3]]),
    ]:
        cfg = IPUConfig()
        cfg.select_ipus = selection
        ipu_config.configure_ipu_system(cfg)
        assert [list(d.ipus) for d in get_system().devices] == expected


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("auto_select_ipus", [16, 1], "asks for 17 IPUs in all, but the system has 16"),
        ("auto_select_ipus", 32, "a device of 32 IPUs, but the system has 16"),
        ("auto_select_ipus", [3], "power of two"),
        ("auto_select_ipus", [0], "at least 1 IPU"),
        ("select_ipus", [24, 5], "share IPU 5"),
        ("select_ipus", [31], "ids go from 0 to 30"),
    ],
)
def test_selection_errors(field, value, match):
    cfg = IPUConfig()
    setattr(cfg, field, value)
    with pytest.raises(ValueError, match=match):
        cfg.configure_ipu_system()
    assert not system_config.has_configured_system()  # a failed configure installs nothing


def test_configure_validation_errors():
    def fails(match, **changes):
        cfg = IPUConfig()
        cfg.from_dict(changes)
        with pytest.raises(ValueError, match=match):
            ipu_config.configure_ipu_system(cfg)

    fails("set only one of them", auto_select_ipus=1, select_ipus=0)
    fails("needs device_connection.version", **{"device_connection.type": DeviceConnectionType.NEVER})
    fails("device_connection.version = 'ipu3'", **{"device_connection.version": "ipu3"})
    fails("exceeds the 1472 tiles", **{"ipu_model.tiles_per_ipu": 5000, "auto_select_ipus": 1})
    fails("place_ops_on_io_tiles", **{"io_tiles.place_ops_on_io_tiles": True})
    fails("available_memory_proportion", **{"io_tiles.available_memory_proportion": 1.5})
    fails("process_index = 2", **{
        "experimental.multi_replica_distribution.process_count": 2,
        "experimental.multi_replica_distribution.process_index": 2,
    })  # fmt: skip
    fails("availableMemoryProportion", **{"matmuls.poplar_options": {"availableMemoryProportion": "2"}})
    fails("maximum_scheduler_lookahead_depth = 0", **{"scheduling.maximum_scheduler_lookahead_depth": 0})
    fails("not supported with I/O tiles", **{
        "io_tiles.num_io_tiles": 32,
        "norms.experimental.distributed_batch_norm_replica_group_size": 2,
    })  # fmt: skip
    with pytest.raises(TypeError, match="expects an IPUConfig"):
        ipu_config.configure_ipu_system({"auto_select_ipus": 1})


def test_ipu_model_restrictions(monkeypatch):
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--use_ipu_model")
    cfg = IPUConfig()
    cfg.select_ipus = [0]
    with pytest.raises(ValueError, match="use auto_select_ipus instead"):
        cfg.configure_ipu_system()
    cfg = IPUConfig()
    cfg.experimental.multi_replica_distribution.process_count = 2
    with pytest.raises(ValueError, match="not supported on the IPU Model"):
        cfg.configure_ipu_system()


def test_default_system_is_one_ipu2_ipu_model():
    system = get_system()
    assert system.is_default and system.ipu_model
    assert system.target.name == "ipu2" and system.tiles_per_ipu == 1472
    assert [d.ipus for d in system.devices] == [(0,)]
    assert ipu_utils.running_on_ipu_model()
    assert ipu_utils.get_num_of_ipus_in_device("/device:IPU:0") == 1
    assert ipu_config.get_ipu_config() == IPUConfig()


def test_configure_reset_and_get_config():
    cfg = IPUConfig()
    cfg.auto_select_ipus = 2
    ipu_config.configure_ipu_system(cfg)
    cfg.auto_select_ipus = 4  # the system keeps its own copy
    assert get_system().devices[0].num_ipus == 2
    assert ipu_config.get_ipu_config().auto_select_ipus == 2
    assert not ipu_utils.running_on_ipu_model()  # simulated hardware without --use_ipu_model
    with pytest.raises(RuntimeError, match="already configured"):
        ipu_config.configure_ipu_system(cfg, reset_configuration=False)
    ipu_config.reset_ipu_configuration()
    assert get_system().is_default
    ipu_config.configure_ipu_system(cfg, reset_configuration=False)
    assert get_system().devices[0].num_ipus == 4


def test_ipu_model_version_and_tiles(monkeypatch):
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--use_ipu_model")
    cfg = IPUConfig()
    cfg.ipu_model.version = "ipu1"
    cfg.configure_ipu_system()
    assert get_system().target.name == "ipu1" and get_system().tiles_per_ipu == 1216
    cfg.ipu_model.version = "ipu21"
    cfg.ipu_model.tiles_per_ipu = 16
    cfg.io_tiles.num_io_tiles = 4
    cfg.configure_ipu_system()
    system = get_system()
    assert system.target.name == "ipu21" and system.target.clock_hz == 1.85e9
    assert system.tiles_per_ipu == 16 and system.compute_tiles_per_ipu == 12
    cfg.ipu_model.version = "ipu3"
    with pytest.raises(ValueError, match="ipu_model.version = 'ipu3'"):
        cfg.configure_ipu_system()


@pytest.mark.parametrize(
    "connection,outcome",
    [
        (DeviceConnectionType.ALWAYS, "run"),
        (DeviceConnectionType.ON_DEMAND, "run"),
        (DeviceConnectionType.PRE_COMPILE, "zeros"),
        (DeviceConnectionType.NEVER, None),
    ],
)
def test_device_connection_semantics(connection, outcome):
    cfg = IPUConfig()
    cfg.device_connection.type = connection
    if connection in (DeviceConnectionType.PRE_COMPILE, DeviceConnectionType.NEVER):
        cfg.device_connection.version = "ipu21"
    cfg.configure_ipu_system()
    system = get_system()
    assert system.connection is connection
    assert system.attached == (connection is DeviceConnectionType.ALWAYS)
    if outcome is None:
        assert not system.executes
        with pytest.raises(RuntimeError, match="NEVER"):
            system.attach()
    else:
        assert system.attach() == outcome
    if connection is DeviceConnectionType.PRE_COMPILE:
        assert system.target.name == "ipu21"


def test_reset_ipu_seed():
    cfg = IPUConfig()
    cfg.auto_select_ipus = [1, 1]
    cfg.configure_ipu_system()
    ipu_utils.reset_ipu_seed(42)
    ipu_utils.reset_ipu_seed(7, device="/device:IPU:1", experimental_identical_replicas=True)
    assert get_system().seeds == {0: (42, False), 1: (7, True)}
    with pytest.raises(ValueError, match="No IPU device '/device:IPU:2'"):
        ipu_utils.reset_ipu_seed(1, device="/device:IPU:2")
    with pytest.raises(TypeError, match="integer"):
        ipu_utils.reset_ipu_seed(1.5)


def test_targets_reproduce_published_peaks():
    tflops = {n: t.peak_flops_per_ipu("float16") / 1e12 for n, t in targets.TARGETS.items()}
    assert tflops["ipu1"] == pytest.approx(124.5, rel=0.01)
    assert tflops["ipu2"] == pytest.approx(250.6, rel=0.01)
    assert tflops["ipu21"] == pytest.approx(348.6, rel=0.01)
    assert targets.TARGETS["ipu2"].sram_bytes_per_ipu == 1472 * 624 * 1024
    with pytest.raises(ValueError, match="'ipu1', 'ipu2', 'ipu21'"):
        targets.get_target("ipu3")


def test_floating_point_behaviour_recorded():
    from keras_ipu.config import StochasticRoundingBehaviour as SR

    cfg = IPUConfig()
    cfg.floating_point_behaviour.oflo = True
    cfg.configure_ipu_system()
    fp = get_system().floating_point
    assert fp == {"inv": False, "div0": False, "oflo": True, "nanoo": False, "esr": SR.OFF}
    cfg.floating_point_behaviour.set_all = True
    cfg.configure_ipu_system()
    assert get_system().floating_point == {
        "inv": True, "div0": True, "oflo": True, "nanoo": True, "esr": SR.ON,
    }  # fmt: skip


def test_config_pickles():
    import pickle

    cfg = IPUConfig()
    cfg.auto_select_ipus = [2, 4]
    cfg.selection_order = SelectionOrder.SNAKE
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_replicas_of_a_device():
    cfg = IPUConfig()
    cfg.select_ipus = [28]  # 8 IPUs: 5, 7, 4, 6, 3, 1, 2, 0 in ladder order
    cfg.configure_ipu_system()
    device = get_system().device(0)
    assert device.replication_factor(1) == 8 and device.replication_factor(4) == 2
    assert device.replica_shard_ipus(4, SelectionOrder.SNAKE) == ((5, 7, 6, 4), (3, 1, 0, 2))
    assert device.replica_shard_ipus(2, SelectionOrder.ZIGZAG)[3] == (2, 0)
    with pytest.raises(ValueError, match="not a multiple of the program's 3 shards"):
        device.replication_factor(3)

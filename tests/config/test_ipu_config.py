"""IPUConfig against the Graphcore API reference: tree, types, defaults, errors."""

import copy
import json
import warnings

import pytest

from keras_ipu import config as ipu_config
from keras_ipu.config import (
    DeviceConnectionType,
    ExecutionProfileType,
    IPUConfig,
    MergeRemoteBuffersBehaviour,
    SchedulingAlgorithm,
    SelectionOrder,
    StochasticRoundingBehaviour,
)
from keras_ipu.device.config.ipu_config import OPTION_NAMES
from keras_ipu.device.config.metadata import IPUConfigDeprecationWarning

# (full name, type as the reference writes it, default), copied by hand from
# the reference's IPUConfig section, a dozen from different categories.
REFERENCE_SPOT_CHECKS = [
    ("allow_recompute", "bool", False),
    ("selection_order", "SelectionOrder", SelectionOrder.AUTO),
    ("auto_select_ipus", "Union[int, List[int], Tuple[int, ...]]", []),
    ("device_connection.type", "DeviceConnectionType", DeviceConnectionType.ALWAYS),
    ("device_connection.version", "str", ""),
    ("experimental.multi_replica_distribution.process_count", "int", 0),
    ("floating_point_behaviour.esr", "StochasticRoundingBehaviour", StochasticRoundingBehaviour.OFF),
    ("io_tiles.available_memory_proportion", "float", 0.9),
    ("ipu_model.compile_ipu_code", "bool", True),
    ("ipu_model.version", "str", "ipu2"),
    ("matmuls.poplar_options", "dict", {}),
    ("norms.experimental.distributed_batch_norm_replica_group_size", "int", 1),
    ("optimizations.math.dot_strength", "bool", True),
    ("optimizations.minimum_remote_tensor_size", "int", 128),
    (
        "optimizations.merge_remote_buffers",
        "MergeRemoteBuffersBehaviour",
        MergeRemoteBuffersBehaviour.IF_BENEFICIAL,
    ),
    ("scheduling.algorithm", "SchedulingAlgorithm", SchedulingAlgorithm.CHOOSE_BEST),
    ("scheduling.maximum_scheduler_search_space_size", "int", 64),
]


def _get(cfg, full):
    for part in full.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("name,type_name,default", REFERENCE_SPOT_CHECKS)
def test_attribute_type_and_default_match_reference(name, type_name, default):
    meta = ipu_config.get_attribute_metadata(name)
    assert meta.name == name
    assert meta.type == type_name
    assert meta.default == default
    assert not meta.deprecated and meta.deprecated_msg is None
    assert _get(IPUConfig(), name) == default


def test_whole_tree_size_and_categories():
    # 57 options in the reference (56 plus the deprecated alias enable_fast_math).
    assert len(OPTION_NAMES) == 56
    cfg = IPUConfig()
    for category in [
        "convolutions", "device_connection", "slices", "experimental",
        "experimental.multi_replica_distribution", "floating_point_behaviour",
        "io_tiles", "ipu_model", "matmuls", "norms", "norms.experimental",
        "optimizations", "optimizations.math", "pooling", "scheduling",
    ]:  # fmt: skip
        meta = cfg.get_attribute_metadata(category)
        assert meta.type is None and meta.default is None
        assert meta.doc.startswith("Sub-category containing")


def test_doc_text_comes_from_reference():
    meta = ipu_config.get_attribute_metadata("floating_point_behaviour.div0")
    assert meta.doc == "If True, a floating point divide by zero operation will cause an exception."
    select = ipu_config.get_attribute_metadata("select_ipus").doc
    assert "gc-info -l" in select and "config.select_ipus = [24, 25]" in select


def test_metadata_relative_to_category():
    cfg = IPUConfig()
    assert cfg.optimizations.get_attribute_metadata("math.fast").name == "optimizations.math.fast"
    assert cfg.ipu_model.get_attribute_metadata("tiles_per_ipu").default == 0
    with pytest.raises(AttributeError, match="tiles_per_ipu"):
        cfg.ipu_model.get_attribute_metadata("tile_per_ipu")


def test_check_type():
    meta = ipu_config.get_attribute_metadata("auto_select_ipus")
    assert meta.check_type(2) and meta.check_type([1, 2]) and meta.check_type((4,))
    for bad in (True, 1.5, [1, "2"], "2", {2: 2}):
        with pytest.raises(TypeError, match="auto_select_ipus"):
            meta.check_type(bad)


def test_set_and_get_values():
    cfg = IPUConfig()
    cfg.auto_select_ipus = [2, 2]
    cfg.selection_order = SelectionOrder.SNAKE
    cfg.ipu_model.tiles_per_ipu = 8
    cfg.io_tiles.available_memory_proportion = 1  # an int is a valid float
    cfg.matmuls.poplar_options = {"availableMemoryProportion": "0.2"}
    assert cfg.auto_select_ipus == [2, 2]
    assert cfg.selection_order is SelectionOrder.SNAKE
    assert cfg.ipu_model.tiles_per_ipu == 8
    assert cfg.io_tiles.available_memory_proportion == 1.0
    assert isinstance(cfg.io_tiles.available_memory_proportion, float)
    # Defaults are not shared between configs (a mutable default).
    cfg.convolutions.poplar_options["x"] = "1"
    assert IPUConfig().convolutions.poplar_options == {}


def test_misspelled_set_names_closest_option_and_type():
    cfg = IPUConfig()
    with pytest.raises(AttributeError) as err:
        cfg.auto_select_ipu = 1
    assert "'auto_select_ipu'" in str(err.value)
    assert "Did you mean 'auto_select_ipus'" in str(err.value)
    assert "Union[int, List[int], Tuple[int, ...]]" in str(err.value)
    with pytest.raises(AttributeError, match="ipu_model.tiles_per_ipu' \\(option of type int\\)"):
        cfg.ipu_model.tile_per_ipu = 4


def test_misspelled_get_and_wrong_level():
    cfg = IPUConfig()
    with pytest.raises(AttributeError, match="Did you mean 'ipu_model.version'"):
        cfg.ipu_model.verison
    with pytest.raises(AttributeError, match="Did you mean 'ipu_model.tiles_per_ipu'"):
        cfg.tiles_per_ipu = 4
    with pytest.raises(AttributeError, match="Did you mean 'floating_point_behaviour'"):
        cfg.floating_point_behavior.esr


def test_wrong_type_names_attribute_and_expected_type():
    cfg = IPUConfig()
    with pytest.raises(TypeError, match="'ipu_model.tiles_per_ipu' must be of type int, got '8'"):
        cfg.ipu_model.tiles_per_ipu = "8"
    with pytest.raises(TypeError, match="must be of type bool"):
        cfg.allow_recompute = 1
    with pytest.raises(TypeError, match="SelectionOrder.SNAKE"):
        cfg.selection_order = "SNAKE"
    with pytest.raises(TypeError, match="category"):
        cfg.ipu_model = 3
    assert cfg.ipu_model.tiles_per_ipu == 0  # a failed set changes nothing


def test_deprecated_alias_warns_and_aliases():
    cfg = IPUConfig()
    with pytest.warns(IPUConfigDeprecationWarning, match="optimizations.math.fast") as record:
        cfg.optimizations.enable_fast_math = True
    assert record[0].filename == __file__  # points at the user's line
    assert cfg.optimizations.math.fast is True
    with pytest.warns(IPUConfigDeprecationWarning):
        assert cfg.optimizations.enable_fast_math is True
    meta = ipu_config.get_attribute_metadata("optimizations.enable_fast_math")
    assert meta.deprecated and "has been moved to" in meta.deprecated_msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg.optimizations.math.fast = False  # the new name does not warn
    assert "optimizations.enable_fast_math" not in cfg.to_dict()


def test_dict_and_json_round_trip():
    cfg = IPUConfig()
    cfg.select_ipus = [24, 25]
    cfg.selection_order = SelectionOrder.HOOF
    cfg.device_connection.type = DeviceConnectionType.ON_DEMAND
    cfg.floating_point_behaviour.esr = StochasticRoundingBehaviour.REPLICA_IDENTICAL_ONLY
    cfg.scheduling.algorithm = SchedulingAlgorithm.LOOK_AHEAD
    cfg.compilation_poplar_options = {"opt.a": "1"}
    cfg.io_tiles.available_memory_proportion = 0.5

    dct = cfg.to_dict()
    assert dct["selection_order"] is SelectionOrder.HOOF
    assert dct["device_connection.type"] is DeviceConnectionType.ON_DEMAND
    other = IPUConfig()
    other.from_dict(dct)
    assert other == cfg

    text = cfg.to_json()
    assert json.loads(text)["scheduling.algorithm"] == "LOOK_AHEAD"
    again = IPUConfig()
    again.from_json(text)
    assert again == cfg
    assert again.floating_point_behaviour.esr is StochasticRoundingBehaviour.REPLICA_IDENTICAL_ONLY
    assert again != IPUConfig()
    assert copy.deepcopy(cfg) == cfg


def test_from_dict_nested_and_errors():
    cfg = IPUConfig()
    cfg.from_dict({"ipu_model": {"version": "ipu21", "tiles_per_ipu": 4}, "auto_select_ipus": 2})
    assert (cfg.ipu_model.version, cfg.ipu_model.tiles_per_ipu, cfg.auto_select_ipus) == (
        "ipu21", 4, 2,
    )  # fmt: skip
    with pytest.raises(AttributeError, match="Did you mean 'ipu_model'"):
        cfg.from_dict({"ipu_modle": {"version": "ipu2"}})
    with pytest.raises(ValueError, match="not a member of SelectionOrder"):
        cfg.from_dict({"selection_order": "SNAIL"})
    with pytest.raises(TypeError, match="io_tiles.num_io_tiles"):
        cfg.from_dict({"io_tiles.num_io_tiles": "4"})


def test_str_and_repr_are_readable():
    cfg = IPUConfig()
    assert repr(cfg) == "IPUConfig(<all defaults>)"
    cfg.auto_select_ipus = 4
    cfg.ipu_model.version = "ipu21"
    text = repr(cfg)
    assert "auto_select_ipus = 4" in text and "version = 'ipu21'" in text
    assert "allow_recompute" not in text
    full = str(cfg)
    assert "  ipu_model:\n" in full and "    tiles_per_ipu = 0" in full
    assert "selection_order = SelectionOrder.AUTO" in full


def test_enums_have_reference_members():
    assert [m.name for m in DeviceConnectionType] == ["ALWAYS", "ON_DEMAND", "PRE_COMPILE", "NEVER"]
    assert [m.name for m in ExecutionProfileType] == [
        "NO_PROFILE", "DEVICE_PROFILE", "IPU_PROFILE", "TILE_PROFILE",
    ]  # fmt: skip
    assert [m.name for m in MergeRemoteBuffersBehaviour] == ["NO_MERGING", "MERGE", "IF_BENEFICIAL"]
    assert [m.name for m in SchedulingAlgorithm] == [
        "CHOOSE_BEST", "CLUSTERING", "POST_ORDER", "LOOK_AHEAD", "SHORTEST_PATH",
    ]  # fmt: skip
    assert [m.name for m in SelectionOrder] == ["AUTO", "ZIGZAG", "SNAKE", "HOOF"]
    assert [m.name for m in StochasticRoundingBehaviour] == [
        "OFF", "ON", "REPLICA_IDENTICAL_ONLY",
    ]  # fmt: skip


def test_misspelling_is_also_a_value_error_as_in_graphcore():
    cfg = IPUConfig()
    with pytest.raises(ValueError, match="Did you mean 'selection_order'"):
        cfg.selection_ordr = SelectionOrder.SNAKE
    assert not hasattr(cfg, "selection_ordr")


def test_esr_bool_is_converted_with_warning():
    cfg = IPUConfig()
    with pytest.warns(IPUConfigDeprecationWarning, match="StochasticRoundingBehaviour.ON"):
        cfg.floating_point_behaviour.esr = True
    assert cfg.floating_point_behaviour.esr is StochasticRoundingBehaviour.ON
    with pytest.warns(IPUConfigDeprecationWarning):
        cfg.floating_point_behaviour.esr = False
    assert cfg.floating_point_behaviour.esr is StochasticRoundingBehaviour.OFF
    with pytest.raises(TypeError, match="floating_point_behaviour.esr"):
        cfg.floating_point_behaviour.esr = 1

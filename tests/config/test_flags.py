"""TF_POPLAR_FLAGS parsing and its effect on the configured system."""

import pytest

from keras_ipu import utils as ipu_utils
from keras_ipu.config import IPUConfig
from keras_ipu.device import flags as poplar_flags
from keras_ipu.device.config import get_system
from keras_ipu.device.flags import SyntheticDataCategory, parse_flags


def test_empty_flags_are_defaults():
    flags = parse_flags("")
    assert flags == poplar_flags.PoplarFlags()
    assert not flags.use_ipu_model and flags.show_progress_bar == "auto"
    assert flags.log_cycle_count == -1


def test_every_known_flag_parses(tmp_path):
    flags = parse_flags(
        f"--use_ipu_model --ipu_model_tiles=8 --executable_cache_path={tmp_path} "
        "--synthetic_data_categories=infeed,Outfeed --show_progress_bar=false "
        "--log_cycle_count=3"
    )
    assert flags.use_ipu_model is True
    assert flags.ipu_model_tiles == 8
    assert flags.executable_cache_path == str(tmp_path)
    assert flags.synthetic_data_categories == {
        SyntheticDataCategory.Infeed, SyntheticDataCategory.Outfeed,
    }  # fmt: skip
    assert flags.show_progress_bar == "false"
    assert flags.log_cycle_count == 3
    assert flags.synthetic_data_for(SyntheticDataCategory.Infeed)
    assert not flags.synthetic_data_for(SyntheticDataCategory.Seed)
    everything = parse_flags("--use_synthetic_data")
    assert all(everything.synthetic_data_for(c) for c in SyntheticDataCategory)
    assert parse_flags("--use_ipu_model=false").use_ipu_model is False


def test_unknown_flag_lists_known_ones():
    with pytest.raises(ValueError) as err:
        parse_flags("--use_ipu_model --use_ipu_modle")
    text = str(err.value)
    assert "unknown flag --use_ipu_modle" in text
    for name in poplar_flags.KNOWN_FLAGS:
        assert f"--{name}" in text


@pytest.mark.parametrize(
    "text,match",
    [
        ("--ipu_model_tiles=0", "positive number of tiles"),
        ("--ipu_model_tiles=many", "needs an integer"),
        ("--ipu_model_tiles", "needs a value"),
        ("--show_progress_bar=maybe", "true, false or auto"),
        ("--synthetic_data_categories=infeed,weights", "unknown synthetic data category 'weights'"),
        ("--use_ipu_model=yes", "takes no value or true/false"),
        ("use_ipu_model", "must start with '--'"),
    ],
)
def test_bad_values(text, match):
    with pytest.raises(ValueError, match=match):
        parse_flags(text)


def test_help_prints_known_flags(monkeypatch, capsys):
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--help")
    IPUConfig().configure_ipu_system()
    out = capsys.readouterr().out
    for name in poplar_flags.KNOWN_FLAGS:
        assert f"--{name}" in out


def test_flags_are_read_when_configuring(monkeypatch, tmp_path):
    cfg = IPUConfig()
    cfg.auto_select_ipus = 1
    cfg.configure_ipu_system()
    assert not ipu_utils.running_on_ipu_model()
    monkeypatch.setenv(
        "TF_POPLAR_FLAGS",
        f"--use_ipu_model --ipu_model_tiles=4 --use_synthetic_data "
        f"--executable_cache_path={tmp_path}",
    )
    assert not ipu_utils.running_on_ipu_model()  # not before the next configure
    cfg.configure_ipu_system()
    system = get_system()
    assert ipu_utils.running_on_ipu_model()
    assert system.tiles_per_ipu == 4
    assert system.flags.executable_cache_path == str(tmp_path)
    assert ipu_utils.use_synthetic_data_for(ipu_utils.SyntheticDataCategory.Parameters)
    # ipu_model.tiles_per_ipu, when set, wins over --ipu_model_tiles.
    cfg.ipu_model.tiles_per_ipu = 32
    cfg.configure_ipu_system()
    assert get_system().tiles_per_ipu == 32


def test_bad_flags_fail_configure(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--no_such_flag")
    with pytest.raises(ValueError, match="unknown flag --no_such_flag"):
        IPUConfig().configure_ipu_system()
    monkeypatch.setenv("TF_POPLAR_FLAGS", "--use_ipu_model --ipu_model_tiles=2000")
    with pytest.raises(ValueError, match="exceeds the 1472 tiles"):
        IPUConfig().configure_ipu_system()
    a_file = tmp_path / "f"
    a_file.write_text("x")
    monkeypatch.setenv("TF_POPLAR_FLAGS", f"--executable_cache_path={a_file}")
    with pytest.raises(ValueError, match="is a file"):
        IPUConfig().configure_ipu_system()

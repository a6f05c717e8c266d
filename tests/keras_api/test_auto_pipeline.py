"""The automatic pipeline split and `python -m keras_ipu.plan`."""

import keras
import numpy as np
import pytest

import keras_ipu as ipu
from keras_ipu.device.units import fmt_bytes
from keras_ipu.models.pipeline_planner import _balanced_split

from ipu_keras_helpers import configure


def test_balanced_split_minimises_the_slowest_stage():
    costs = [5, 1, 1, 1, 4, 2, 2]
    split = _balanced_split(costs, 4)
    assert split == sorted(split) and set(split) == {0, 1, 2, 3}
    # 5 alone is the lower bound of the largest part: the split reaches it.
    assert max(sum(c for c, s in zip(costs, split) if s == k) for k in range(4)) == 5
    assert _balanced_split([1, 1, 1, 1], 2) == [0, 0, 1, 1]
    assert _balanced_split([9, 1, 1], 3) == [0, 1, 2]


def mlp(strategy, widths, batch_inputs=256):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        layers = [keras.Input((batch_inputs,))]
        layers += [keras.layers.Dense(w, activation="relu") for w in widths]
        model = keras.Sequential(layers)
        model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


def test_auto_pipeline_balances_and_applies():
    configure(4)
    strategy = ipu.ipu_strategy.IPUStrategy()
    # One heavy layer (1024 x 1024) among light ones: it gets a stage alone.
    model = mlp(strategy, [64, 64, 1024, 1024, 64, 64, 10])
    lines = []
    plan = ipu.models.auto_pipeline(model, 4, 32, print_fn=lines.append)
    assert plan.fits and plan.num_stages == 4
    assert plan.assignment == sorted(plan.assignment) and set(plan.assignment) == {0, 1, 2, 3}
    heavy = plan.assignment[3]
    assert plan.assignment.count(heavy) == 1  # the 1024x1024 layer alone
    assert "why: the fastest per weight update of all 20 contiguous splits" in lines[0]
    # The fastest of the 20 splits; the reason names the stage pacing it.
    assert plan.prediction.sharded.step_cycles == min(plan.candidates.values())
    slowest = max(plan.prediction.sharded.ipus, key=lambda p: p.cycles)
    assert f"stage {slowest.ipu} is the slowest ({slowest.cycles:,} cycles" in lines[0]
    plan.apply(model)
    assert [a.pipeline_stage for a in model.get_pipeline_stage_assignment()] == plan.assignment
    assert model._ipu_options.pipelining_device_mapping == [0, 1, 2, 3]


def test_does_not_fit_on_one_ipu_but_on_four():
    strategy = ipu.ipu_strategy.IPUStrategy()
    # Traced, never run: activations of a micro-batch of 8192 are abstract.
    model = mlp(strategy, [2048] * 6 + [10])
    one = ipu.models.auto_pipeline(model, 1, 8192, gradient_accumulation=8, print_fn=None)
    assert not one.fits and "no split over 1 IPU(s) fits" in one.reason
    # Balanced splits overflow IPU 0 (Grouped stashes 7 micro-batches of its
    # activations): the one that fits holds a single layer on each of the
    # first IPUs, whatever the cycles.
    four = ipu.models.auto_pipeline(model, 4, 8192, gradient_accumulation=8, print_fn=None)
    assert four.fits and "19 of the splits predicted did not fit" in four.reason
    assert four.assignment == [0, 1, 2, 3, 3, 3, 3]
    assert four.assignment == sorted(four.assignment)


def test_the_choice_is_the_best_split_as_fits_executable_predicts_it():
    """auto_pipeline decides from the prediction fit's own program makes
    (g micro-batches under the schedule, the stash, the update once per
    step): for each candidate split of a 4-layer model over 2 IPUs, the
    plan's cycles per weight update equal those of the executable fit
    compiles for that split, and the plan is the fastest of them."""
    g, mb = 4, 8
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(g * mb, 64)).astype("float32"), rng.normal(
        size=(g * mb, 8)).astype("float32")

    def model():
        configure(2)
        m = mlp(ipu.ipu_strategy.IPUStrategy(), [128, 256, 256, 8], batch_inputs=64)
        m.compile(keras.optimizers.SGD(0.1), "mse", steps_per_execution=g)
        m.set_pipelining_options(gradient_accumulation_steps_per_replica=g)
        return m

    plan = ipu.models.auto_pipeline(model(), 2, mb, print_fn=None)
    assert sorted(plan.candidates) == [(0, 0, 0, 1), (0, 0, 1, 1), (0, 1, 1, 1)]
    by_executable = {}
    for split in plan.candidates:
        m = model()
        ipu.models.pipeline_planner.PipelinePlan(
            m.name, list(split), [], None, "").apply(m)
        m.fit(x, y, batch_size=mb, epochs=1, verbose=0, shuffle=False)
        (exe,) = m.train_function.device_loop.executables()
        by_executable[split] = exe.prediction.pipeline.step_cycles
    assert plan.candidates == by_executable
    assert tuple(plan.assignment) == min(by_executable, key=by_executable.get)
    assert plan.prediction.sharded.step_cycles == min(by_executable.values())
    # The candidates differ: the choice is no tie.
    assert len(set(by_executable.values())) == 3


def test_beyond_the_exhaustive_limit_a_local_search_from_the_balanced_split():
    """84 contiguous splits of 10 layers over 4 IPUs (more than
    EXHAUSTIVE_SPLITS): the plan is a split no neighbour (one boundary
    moved) of which predicts fewer cycles, all of them predicted."""
    from keras_ipu.models import pipeline_planner as planner

    configure(4)
    model = mlp(ipu.ipu_strategy.IPUStrategy(), [32, 128, 32, 32, 256, 32, 32, 64, 32, 8],
                batch_inputs=32)
    plan = ipu.models.auto_pipeline(model, 4, 8, print_fn=None)
    assert planner._split_count(10, 4) == 84 > planner.EXHAUSTIVE_SPLITS
    assert "of 84 contiguous splits" in plan.reason and plan.fits
    assert len(plan.candidates) < 84
    mine = plan.candidates[tuple(plan.assignment)]
    for neighbour in planner._neighbours(plan.assignment, 4):
        assert plan.candidates[tuple(neighbour)] >= mine


def test_too_many_ipus_for_the_layers():
    strategy = ipu.ipu_strategy.IPUStrategy()
    model = mlp(strategy, [8, 1])
    with pytest.raises(ValueError, match="has 2 layer invocations: it cannot be split into 4"):
        ipu.models.auto_pipeline(model, 4, 8, print_fn=None)


def test_plan_command(tmp_path, capsys):
    from keras_ipu import plan as plan_cli

    strategy = ipu.ipu_strategy.IPUStrategy()
    path = str(tmp_path / "model.keras")
    mlp(strategy, [256, 256, 10]).save(path)
    assert plan_cli.main([path, "--ipus", "2", "--batch-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "2 stages on 2 ipu2 IPUs, micro-batch 16" in out and "fits;" in out
    # An uncompiled model gets Adam here: the moments of the 256x256 and
    # 256x10 kernels and of the 256-wide bias go to Streaming Memory by
    # default on ipu2 (remote buffers); the 10-wide bias's (40 B) stay, under
    # minimum_remote_tensor_size (128 B).
    bare = str(tmp_path / "bare.keras")
    keras.Sequential([keras.Input((256,)), keras.layers.Dense(256), keras.layers.Dense(10)]).save(bare)
    assert plan_cli.main([bare, "--ipus", "2", "--batch-size", "16", "--optimizer", "adam",
                          "--loss", "mse"]) == 0
    moments = 2 * 4 * (256 * 256 + 256 + 256 * 10)
    assert f"optimizer state in Streaming Memory (offload_weight_update_variables): " \
        f"{fmt_bytes(moments)}" in capsys.readouterr().out
    assert plan_cli.main([path, "--ipus", "1", "--batch-size", "262144", "--ipu", "ipu21"]) == 1
    assert "does NOT fit" in capsys.readouterr().out

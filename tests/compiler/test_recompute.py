"""The recomputation pass (compiler/recompute.py): same values, fewer live
activations, checked by hand on a chain of sin layers.

The program: x (f32[N]) -> a1 = sin(x) -> ... -> a8 = sin(a7) -> loss =
sum(a8), and its gradient. The backward node of layer k is cos(a_{k-1}),
so without recomputation a1..a7 (and a8 until the sum) are all live when
the forward pass ends. Fusion is off so each op is one program step and
the live sets can be counted by hand; a final test runs all passes.
"""

import numpy as np
import pytest

from keras_ipu.device.autodiff import value_and_grad
from keras_ipu.device.compiler import CompileOptions
from keras_ipu.device.compiler.cache import ExecutableCache
from keras_ipu.device.compiler.placement import Placement
from keras_ipu.device.compiler.recompute import RecomputationMode
from keras_ipu.device.compiler.recompute import recompute
from keras_ipu.device.jit import jit
from keras_ipu.device.primitives import elementwise as ew
from keras_ipu.device.primitives.markers import recomputation_checkpoint
from keras_ipu.device.primitives.reduce import reduce_sum_p
from keras_ipu.device.trace import trace_flat
from keras_ipu.device.ir import ShapedArray

N = 1024
ARRAY = N * 4  # bytes of one activation
SCALAR = 4  # the loss, live from the sum to the end
LAYERS = 8
INTERLEAVED = RecomputationMode.RecomputeAndBackpropagateInterleaved
THEN = RecomputationMode.RecomputeThenBackpropagate


def chain(x, every=0):
    """LAYERS sin layers; a checkpoint after every `every` layers."""
    for i in range(1, LAYERS + 1):
        x = ew.sin_p.bind(x)
        if every and i % every == 0 and i < LAYERS:
            x = recomputation_checkpoint(x)
    return reduce_sum_p.bind(x, axes=(0,))


def compiled(every, mode, fuse=False):
    step = jit(lambda x: value_and_grad(lambda v: chain(v, every))(x),
               options=CompileOptions(recomputation=mode, fuse_elementwise=fuse),
               cache=ExecutableCache())
    x = np.linspace(-1, 1, N, dtype=np.float32)
    return step.executable(x), step(x)


def peak(every, mode):
    return compiled(every, mode)[0].memory.not_always_live_bytes


def test_without_recomputation_every_activation_is_live_at_the_loss():
    # a1..a8 (a8 until the sum reads it) and the loss.
    assert peak(0, None) == LAYERS * ARRAY + SCALAR
    # Checkpoints mean nothing without recomputation: removed, not copies.
    assert peak(2, None) == LAYERS * ARRAY + SCALAR


def test_checkpoints_bound_the_live_activations_to_one_segment():
    # At the sum: the three stored checkpoints (a2, a4, a6), a8 and the
    # loss; a1, a3, a5, a7 died in the forward pass and are recomputed one
    # segment at a time, each from its checkpoint, in the backward pass.
    assert peak(2, INTERLEAVED) == 4 * ARRAY + SCALAR
    # Every 4 layers: a4 stored; in the backward pass of layers 5-8 the
    # copies of a5, a6, a7 are live with a4 and the loss (the cotangents
    # are computed in place of the copies they read last).
    assert peak(4, INTERLEAVED) == 4 * ARRAY + SCALAR


def test_without_checkpoints_the_backward_pass_recomputes_from_the_input():
    # The first backward node needs a7: the copies of a1..a7 are made from
    # x (an input, always live) and are live together; the originals died.
    assert peak(0, INTERLEAVED) == 7 * ARRAY + SCALAR
    # RecomputeThenBackpropagate ignores checkpoints, as on the IPU.
    assert peak(2, THEN) == 7 * ARRAY + SCALAR
    assert peak(0, THEN) == 7 * ARRAY + SCALAR


@pytest.mark.parametrize("every", [0, 2, 3])
@pytest.mark.parametrize("mode", [None, THEN, INTERLEAVED])
@pytest.mark.parametrize("fuse", [False, True])
def test_values_are_unchanged(every, mode, fuse):
    _, (want_loss, want_grad) = compiled(every, None)
    _, (loss, grad) = compiled(every, mode, fuse)
    np.testing.assert_array_equal(loss, want_loss)
    np.testing.assert_array_equal(grad, want_grad)


def test_copies_survive_the_other_passes():
    # With every pass on, CSE could merge a copy into the forward node it
    # repeats: the barriers keep the copies in the program. (Fused, this
    # all-elementwise chain keeps its activations inside three kernels and
    # needs no recomputation; tests/layers measure a Keras model.)
    off, _ = compiled(2, None, fuse=True)
    on, _ = compiled(2, INTERLEAVED, fuse=True)
    names = [node.primitive.name for node in on.steps]
    assert names.count("optimization_barrier") == 4  # a2, a4, a6 and x
    assert len(on.steps) > len(off.steps)


def _trained_graph(every):
    graph, _ = trace_flat(
        lambda x: list(value_and_grad(lambda v: chain(v, every))(x)),
        [ShapedArray((N,), np.float32)])
    return graph


def test_the_pass_is_idempotent():
    once = recompute(_trained_graph(2), INTERLEAVED)
    twice = recompute(once, INTERLEAVED)
    assert [n.primitive.name for n in twice.nodes] == [
        n.primitive.name for n in once.nodes]


def test_mode_by_name_and_bad_mode():
    graph = _trained_graph(2)
    by_name = recompute(graph, "RecomputeAndBackpropagateInterleaved")
    assert len(by_name.nodes) == len(recompute(graph, INTERLEAVED).nodes)
    with pytest.raises(ValueError, match="recomputation='sometimes' is not"):
        recompute(graph, "sometimes")


def test_allow_recompute_turns_it_on(monkeypatch):
    from keras_ipu.config import IPUConfig
    from keras_ipu.device.compiler import device_checks

    config = IPUConfig()
    config.allow_recompute = True
    config.configure_ipu_system()
    try:
        options = device_checks.resolve_options(CompileOptions())
        assert options.recomputation is RecomputationMode.Auto
    finally:
        IPUConfig().configure_ipu_system()
    options = device_checks.resolve_options(CompileOptions())
    assert options.recomputation is None


def test_pipeline_stage_inputs_are_stored():
    # Two pipeline stages of four layers: the second stage's input (a4) is
    # stored like a checkpoint, as a pipeline stashes its stage inputs and
    # recomputes each stage from them.
    from keras_ipu.device.trace import stage_scope

    def staged(x):
        with stage_scope(0):
            for _ in range(4):
                x = ew.sin_p.bind(x)
        with stage_scope(1):
            for _ in range(4):
                x = ew.sin_p.bind(x)
            return reduce_sum_p.bind(x, axes=(0,))

    def program(mode, placement=None):
        step = jit(lambda x: value_and_grad(staged)(x),
                   options=CompileOptions(recomputation=mode, fuse_elementwise=False,
                                          placement=placement),
                   cache=ExecutableCache())
        x = np.linspace(-1, 1, N, dtype=np.float32)
        return step.executable(x), step(x)

    (plain, want), (staged_exe, got) = program(None), program(INTERLEAVED)
    assert staged_exe.memory.not_always_live_bytes == 4 * ARRAY + SCALAR
    assert plain.memory.not_always_live_bytes == LAYERS * ARRAY + SCALAR
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    # On two IPUs the second stage's input arrives by an inter-IPU copy and
    # is stored there; every copy and barrier runs on its stage's IPU.
    two_ipus = Placement.of({}, device_mapping=[0, 1])
    (placed_plain, _), (placed, got) = (program(None, two_ipus),
                                        program(INTERLEAVED, two_ipus))
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    for ipu in (0, 1):  # no stashing here: one micro-batch, no checkpoints
        assert (placed.memory_by_ipu[ipu].not_always_live_bytes
                <= placed_plain.memory_by_ipu[ipu].not_always_live_bytes)

    def copies(exe):
        return sum(n.primitive.name == "ipu_copy" for n in exe.steps)

    # Nothing is sent again: the stage input is stored where it arrived.
    assert copies(placed) == copies(placed_plain)
    assert all(n.ipu in (0, 1) for n in placed.steps
               if n.primitive.name != "ipu_copy")

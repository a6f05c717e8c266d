"""keras_ipu's own float32 gemm (device/native/_gemm.h), which the C
pool's float32 blocks and the engine's whole float32 products run where
the CPU has AVX-512 (product_pool.native_gemm): float32 accuracy against
float64 products on every layout and odd shapes, any split giving the
whole call's bits (one FMA chain per element), zero sizes, and the
`KERAS_IPU_NATIVE_GEMM` switch."""

import numpy as np
import pytest

from keras_ipu.device.native import product_pool
from keras_ipu.device.native import threads

needs_kernel = pytest.mark.skipif(not product_pool.native_gemm(),
                                  reason="no AVX-512 here, or KERAS_IPU_NATIVE_GEMM=0")
RNG = np.random.default_rng(21)
EPS = np.finfo(np.float32).eps


def _operand(rows, cols, transposed, pad):
    """A (rows, cols) float32 operand laid out row-major (or, transposed,
    column-major) inside a wider array: leading dimension cols + pad."""
    if transposed:
        base = RNG.standard_normal((cols, rows + pad)).astype(np.float32)
        return base[:, :rows].T
    base = RNG.standard_normal((rows, cols + pad)).astype(np.float32)
    return base[:, :cols]


def _within_float32(got, x, y):
    """The sequential-sum bound: |got - x @ y| <= k eps (|x| @ |y|) (plus a
    tiny absolute term for exact cancellations), in float64."""
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    bound = x.shape[-1] * EPS * (np.abs(x64) @ np.abs(y64)) + 1e-30
    return bool((np.abs(got - x64 @ y64) <= bound).all())


@needs_kernel
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_random_shapes_are_float32_products(layout):
    for _ in range(40):
        m, k, n = (int(v) for v in RNG.integers(1, 301, 3))
        pads = RNG.integers(0, 5, 3)
        x = _operand(m, k, layout[0] == "t", int(pads[0]))
        y = _operand(k, n, layout[1] == "t", int(pads[1]))
        out = np.full((m, n + int(pads[2])), np.nan, np.float32)[:, :n]  # ldc > n
        assert product_pool.matmul(x, y, out=out) is out
        assert _within_float32(out, x, y), (m, k, n, layout)
        assert np.isnan(out.base[:, n:]).all()  # nothing written past the columns


@needs_kernel
def test_the_register_blocks_edges_and_tails():
    # Rows around the 12-row block, columns around the 32-column strip and
    # its 16-column halves, k around the 16-float transposes of B^T.
    for m in (1, 2, 11, 12, 13, 25):
        for n in (1, 15, 16, 17, 31, 32, 33, 65):
            for k in (1, 2, 15, 16, 17, 33):
                for layout in ("nn", "tn", "nt"):
                    x = _operand(m, k, layout[0] == "t", 1)
                    y = _operand(k, n, layout[1] == "t", 3)
                    got = product_pool.matmul(x, y)
                    assert got.shape == (m, n) and _within_float32(got, x, y), (m, n, k)


@needs_kernel
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_any_split_gives_the_whole_calls_bits(layout):
    """One FMA chain per element whatever the block: rows, columns and
    rectangles cut anywhere (blocks of one row or column included), on
    one thread or two, give the whole product's bits, and so does every
    layout of the same operands (B^T packed in chunks of k: _gemm.h's
    GEMM_KC, 256)."""
    for _ in range(12):
        m, n = (int(v) for v in RNG.integers(2, 260, 2))
        k = int(RNG.integers(2, 700))
        x = _operand(m, k, layout[0] == "t", 2)
        y = _operand(k, n, layout[1] == "t", 0)
        whole = product_pool.matmul(x, y)
        assert whole.tobytes() == product_pool.matmul(np.ascontiguousarray(x),
                                                      np.ascontiguousarray(y)).tobytes()
        rows = np.unique(np.concatenate(([0, m], RNG.integers(1, m, 3)))).astype(np.int64)
        columns = np.unique(np.concatenate(([0, n], RNG.integers(1, n, 3)))).astype(np.int64)
        splits = [(0, rows), (1, columns)]
        if m > 3 and n > 3:  # rectangles: no side of one (the pool's check)
            r, c = int(RNG.integers(2, m - 1)), int(RNG.integers(2, n - 1))
            splits.append((2, np.array([[0, r, 0, c], [0, r, c, n], [r, m, 0, n]], np.int64)))
        for axis, edges in splits:
            for t in (1, 2):
                out = np.full((m, n), np.nan, np.float32)
                assert product_pool.run(x, y, out, axis, edges, t) is not None
                assert out.tobytes() == whole.tobytes(), (m, k, n, axis, edges)


@needs_kernel
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_packed_blocks_give_the_bits_of_the_strip_by_strip_kernel(layout):
    """Products with 64 rows or more (_gemm.h's GEMM_PACK_B_ROWS), k of
    1024 or more and op(B) over 1 MiB run in k-blocks of at most 256
    (GEMM_KC, cut evenly at multiples of 16) with op(B) packed GEMM_NC =
    1024 columns at a time (and TN's op(A) from 256 columns): their row
    blocks under 64 rows, and their column blocks under 1 MiB of op(B),
    run strip by strip, and give the same bits. k past the block and not a
    multiple of it or of 16, columns past GEMM_NC and not a multiple of
    the 32-column strip, rows not a multiple of the 12-row block nor of
    the 144-row block of op(A); 64 and 65 rows (packed) cut into blocks
    of 63 and fewer (strip by strip); the transformer's weight gradients
    over batch x sequence (k past 8192, 40-64 columns)."""
    for m, n, k in ((300, 1100, 1030), (257, 260, 1030), (290, 47, 5600), (128, 520, 1030),
                    (64, 300, 4100), (65, 1030, 1030), (128, 64, 8200), (70, 40, 8209)):
        x = _operand(m, k, layout[0] == "t", 3)
        y = _operand(k, n, layout[1] == "t", 1)
        whole = product_pool.matmul(x, y)
        assert _within_float32(whole, x, y), (m, n, k, layout)
        rows = np.unique(np.array([0, 1, min(63, m - 1), m], np.int64))
        columns = np.unique(np.array([0, 33, n // 2, n], np.int64))
        for axis, edges in ((0, rows), (1, columns)):
            out = np.full((m, n), np.nan, np.float32)
            assert product_pool.run(x, y, out, axis, edges, 2) is not None
            assert out.tobytes() == whole.tobytes(), (m, n, k, layout, axis)


@needs_kernel
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_thin_products_row_tails_give_numpys_values_and_their_splits_bits(layout):
    """Few rows over a long k and a wide op(B) (the LSTM's and the
    transformer's weight gradients, the stems' 27 rows): every row tail
    of the 12-row block and the packing's 64-row bound, within float32 of
    the float64 product and with the bits of the product cut into blocks
    of single rows (strip by strip) and of columns under 1 MiB of op(B)."""
    k, n = 1100, 300  # op(B) 1.3 MiB: packed from 64 rows
    y = _operand(k, n, layout[1] == "t", 1)
    for m in (*range(1, 14), 16, 27, 63, 64, 65):
        x = _operand(m, k, layout[0] == "t", 2)
        whole = product_pool.matmul(x, y)
        assert whole.shape == (m, n) and _within_float32(whole, x, y), (m, layout)
        for axis, edges in ((0, np.unique([0, 1, m // 2, m - 1, m])), (1, [0, 32, 47, 200, n])):
            out = np.full((m, n), np.nan, np.float32)
            assert product_pool.run(x, y, out, axis, np.asarray(edges, np.int64), 2) is not None
            assert out.tobytes() == whole.tobytes(), (m, layout, axis)
    x = _operand(0, k, layout[0] == "t", 2)  # no rows
    assert product_pool.matmul(x, y).shape == (0, n)


@needs_kernel
@pytest.mark.parametrize("layout", ["nt", "tt"])
def test_nt_with_fewer_rows_gives_the_bits_of_the_strip_by_strip_kernel(layout):
    """op(B) = B^T with fewer rows than columns runs as C^T = B op(A)^T
    (op(A)^T packed 32 rows of C at a time, written transposed): its
    column blocks narrower than its rows, and the products with more rows
    whose row blocks are narrower than their columns, give the same bits.
    Row tails of 1-31 (the strip of 32), k not a multiple of 16."""
    for m, n, k in ((40, 300, 517), (300, 40, 517), (7, 65, 33), (65, 7, 33)):
        x = _operand(m, k, layout[0] == "t", 2)
        y = _operand(k, n, layout[1] == "t", 1)
        whole = product_pool.matmul(x, y)
        assert _within_float32(whole, x, y), (m, n, k, layout)
        side = min(m, n)
        axis = 1 if m < n else 0
        edges = np.unique(np.array([0, side // 2, side, max(m, n)], np.int64))
        out = np.full((m, n), np.nan, np.float32)
        assert product_pool.run(x, y, out, axis, edges, 2) is not None
        assert out.tobytes() == whole.tobytes(), (m, n, k, layout)


@needs_kernel
def test_batched_products_are_each_batchs_whole_call():
    x = RNG.standard_normal((5, 3, 40, 24)).astype(np.float32)
    y = RNG.standard_normal((5, 3, 24, 33)).astype(np.float32)
    got = product_pool.matmul(x, y)
    for i in range(5):
        for j in range(3):
            assert got[i, j].tobytes() == product_pool.matmul(x[i, j], y[i, j]).tobytes()
    assert _within_float32(got, x, y)


@pytest.mark.parametrize("m,k,n", [(0, 5, 7), (5, 0, 7), (5, 7, 0), (0, 0, 0), (1, 1, 1)])
def test_zero_and_unit_sizes(m, k, n):
    x = RNG.standard_normal((m, k)).astype(np.float32)
    y = RNG.standard_normal((k, n)).astype(np.float32)
    got = product_pool.matmul(x, y)
    assert got.shape == (m, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, x.astype(np.float64) @ y, rtol=1e-6, atol=1e-6)
    out = np.full((m, n), np.nan, np.float32)
    # The pool: a product with a side of 0 is no product of its blocks.
    if m and n:
        edges = np.array([0, m], np.int64)
        done = product_pool.run(x, y, out, 0, edges, 2)
        assert done is None or np.array_equal(out, got)


def test_other_dtypes_and_broadcasts_are_numpys():
    x = RNG.standard_normal((40, 30))
    y = RNG.standard_normal((30, 20))
    assert product_pool.matmul(x, y).tobytes() == np.matmul(x, y).tobytes()  # float64
    xb = RNG.standard_normal((4, 40, 30)).astype(np.float32)
    yb = RNG.standard_normal((1, 30, 20)).astype(np.float32)  # broadcast: NumPy's
    assert product_pool.matmul(xb, yb).tobytes() == np.matmul(xb, yb).tobytes()
    assert product_pool.whole_matmul(np.float64) is np.matmul
    strided = RNG.standard_normal((40, 60)).astype(np.float32)[:, ::2]  # no unit stride
    assert product_pool.matmul(strided, y.astype(np.float32)).tobytes() == np.matmul(
        strided, y.astype(np.float32)).tobytes()


@pytest.fixture
def rule_again(monkeypatch):
    """product_pool's rule found again under the test's environment, and
    again under the real one after it (the C module's choice of kernel
    is process-wide)."""
    def find():
        product_pool._rules = None
        return product_pool.rule()

    yield find
    monkeypatch.undo()
    find()


def test_the_switch_turns_the_kernel_off_and_the_bits_are_numpys(rule_again, monkeypatch):
    threads.configure()  # np.matmul on one OpenBLAS thread, as the engine runs it
    monkeypatch.setenv("KERAS_IPU_NATIVE_GEMM", "0")
    rule = rule_again()
    assert not product_pool.native_gemm()
    assert product_pool.whole_matmul(np.float32) is np.matmul
    x = RNG.standard_normal((128, 256)).astype(np.float32)
    y = RNG.standard_normal((256, 96)).astype(np.float32)
    assert product_pool.matmul(x, y).tobytes() == np.matmul(x, y).tobytes()
    if rule is not None:  # the pool's blocks are OpenBLAS' again, NumPy's bits
        planned = product_pool.blocks(128, 96, 256, 2, 1)
        if planned is not None:
            out = np.empty((128, 96), np.float32)
            assert product_pool.run(x, y, out, *planned, 2) is not None
            assert out.tobytes() == np.matmul(x, y).tobytes()
    monkeypatch.setenv("KERAS_IPU_NATIVE_GEMM", "1")
    rule = rule_again()
    if product_pool.native_gemm():
        assert rule == product_pool.ANYWHERE


def test_a_misspelt_switch_is_an_error(rule_again, monkeypatch):
    monkeypatch.setenv("KERAS_IPU_NATIVE_GEMM", "of")
    with pytest.raises(ValueError, match="KERAS_IPU_NATIVE_GEMM"):
        rule_again()

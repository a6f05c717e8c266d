"""Smoke test of benchmarks/host_threads.py on two small products: it runs,
and its report holds a time per thread count and the policy's pick for
each product. Speed is never asserted here."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "host_threads.py"


def test_reports_each_product_on_each_count(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("host_threads", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "PRODUCTS", [("rows", 0, 64, 8, 16),
                                            ("batched", 4, 32, 8, 8)])
    small = [(label, module, name, params, tuple((8, 4, 4, 2) if s else () for s in shapes))
             for label, module, name, params, shapes in bench.MEMORY_BOUND]
    monkeypatch.setattr(bench, "MEMORY_BOUND", small)
    out = tmp_path / "host.json"
    bench.main(["--threads", "1,2", "--repeats", "2", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["threads"] == [1, 2]
    assert set(report["round_trip_us"]) == {"1", "2"}
    from keras_ipu.device.native import threads

    # The C pool where there is one, our Python pool with its blocks per
    # thread, with one, then OpenBLAS' threads
    # where this process can set them.
    from keras_ipu.device.native import product_pool

    splits = [("pool", threads.BLOCKS_PER_THREAD), ("pool", 1)]
    if product_pool.available():
        splits.insert(0, ("c pool", threads.BLOCKS_PER_THREAD))
        assert set(report["c_pool_split_and_alone_us"]) == {"1", "2"}
    if threads.blas_thread_setters():
        splits.append(("openblas", 0))
    assert [(r["split"], r["blocks_per_thread"]) for r in report["products"]] == [
        s for s in splits for _ in bench.PRODUCTS]
    for row, (label, b, m, n, k) in zip(report["products"], bench.PRODUCTS * len(splits)):
        assert row["product"] == label
        assert set(row["ms"]) == set(row["cpu_ms"]) == {"1", "2"}
        assert all(v > 0 for v in row["ms"].values())
        assert row["policy"] == threads.product_threads(b, m, n, k, "float32")
        assert row["policy_openblas"] == (
            0 if b else threads.blas_threads_for(2 * m * n * k))
    assert set(report["handoff"]) == {"1", "2"}
    assert all(v["split_us"] > 0 for v in report["handoff"].values())
    assert "| rows | 0 |" in report["table"]
    # the memory-bound kernels as lowered: a wall and CPU time per count
    assert [r["kernel"] for r in report["memory_bound"]] == [k[0] for k in small]
    for row in report["memory_bound"]:
        assert set(row["wall_ms"]) == set(row["cpu_ms"]) == {"1", "2"}
        assert all(v > 0 for v in row["min_ms"].values())

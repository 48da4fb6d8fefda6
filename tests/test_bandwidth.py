"""tasks/measure/bandwidth.py: the machine's read/copy bandwidth, probed once per machine
fingerprint and thread count and read from its file after; decode's share of it."""

from __future__ import annotations

from tasks.measure import bandwidth
from tasks.phases import decode


def test_the_probe_measures_read_and_copy(monkeypatch):
    monkeypatch.setattr(bandwidth, "MIN_BYTES", 8 << 20)
    monkeypatch.setattr(bandwidth, "last_level_cache_bytes", lambda: 0)
    figures = bandwidth.probe(2, repeats=2)
    assert figures["read_gbs"] > 0 and figures["copy_gbs"] > 0 and figures["probe_bytes"] == 8 << 20


def test_measured_once_per_fingerprint_and_thread_count(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(bandwidth, "probe", lambda threads: calls.append(threads) or {"read_gbs": 10.0 * threads, "copy_gbs": 5.0})
    assert bandwidth.machine_bandwidth(1, tmp_path)["read_gbs"] == 10.0
    assert bandwidth.machine_bandwidth(1, tmp_path)["read_gbs"] == 10.0
    assert bandwidth.machine_bandwidth(2, tmp_path)["read_gbs"] == 20.0
    assert calls == [1, 2]
    assert len(list((tmp_path / bandwidth.FOLDER).glob("*.json"))) == 2


def test_kept_in_the_users_cache_by_default(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(bandwidth, "probe", lambda threads: {"read_gbs": 7.0, "copy_gbs": 5.0})
    assert bandwidth.machine_bandwidth(1)["read_gbs"] == 7.0
    (kept,) = (tmp_path / "phasesweep" / bandwidth.FOLDER).glob("*.json")
    monkeypatch.setattr(bandwidth, "probe", lambda threads: {"read_gbs": 99.0, "copy_gbs": 5.0})
    assert bandwidth.machine_bandwidth(1)["read_gbs"] == 7.0  # read back, not probed again
    kept.unlink()
    assert bandwidth.machine_bandwidth(1)["read_gbs"] == 99.0


def test_decode_reports_its_share_of_the_roofline():
    details = {"parameters": 1000, "tied_embeddings": 1, "layers": 1, "kv_heads": 1, "head_dim": 1}
    import numpy as np

    feeds = {"input_ids": np.zeros((1, 1), np.int64)}
    kw = {"model_dtype": "float32", "details": details, "feeds": feeds, "median_ms": 1e-3}  # 4000 B in 1 us: 4 GB/s
    cpu = decode.extra_metrics(**kw, peak_gbs=None, bandwidth=lambda: {"read_gbs": 16.0, "copy_gbs": 8.0})
    assert cpu["bandwidth_share"] == 0.25 and cpu["machine_read_bandwidth_gbs"] == 16.0
    gpu = decode.extra_metrics(**kw, peak_gbs=8.0, bandwidth=None)
    assert gpu["bandwidth_share"] == 0.5 and "machine_read_bandwidth_gbs" not in gpu

"""workbench.profiles.cache: profiles kept by content, remade when their key or file changes."""

from __future__ import annotations

from workbench.model.chain import Chain, Layer
from workbench.profiles.cache import cached_profile, profile_cache_dir, profiler_digest


def _chain(saved=4.0):
    return Chain((Layer("a", 0.001, 0.002, 10, 4, saved, comm_forward_bytes=8.0),), meta={"network": "toy"})


def test_hit_miss_and_a_changed_file(tmp_path):
    calls = []

    def make():
        calls.append(1)
        return _chain()

    first, made = cached_profile({"model": "toy", "tp": 2}, make, tmp_path)
    again, made_again = cached_profile({"model": "toy", "tp": 2}, make, tmp_path)
    assert (made, made_again, len(calls)) == (True, False, 1)
    assert again.layers == first.layers and again[0].comm_forward_bytes == 8.0
    cached_profile({"model": "toy", "tp": 4}, make, tmp_path)                # another key
    assert len(calls) == 2
    csv = next(p for p in tmp_path.glob("*.csv"))
    csv.write_text(csv.read_text().replace(",4,", ",5,"))                 # tampered: its checksum fails
    cached_profile({"model": "toy", "tp": 2}, make, tmp_path)
    cached_profile({"model": "toy", "tp": 4}, make, tmp_path)
    assert len(calls) == 3


def test_default_folder_and_code_digest(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    assert profile_cache_dir() == tmp_path / "profiles"
    assert len(profiler_digest()) == 16

"""The PipeDream profiles shipped in data/profiles/pipedream: complete, licensed, found by name, equal to the peer
copy beside the repository where there is one."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from workbench import paths
from workbench.profiles import available_profiles, load_profile, resolve_profile

NETS = ("alexnet", "densenet121", "gnmt", "inception_v3", "nasnetamobile", "resnet101", "resnet18", "resnet50", "vgg16")



def shared_peer_profiles_dir() -> Path | None:
    """The reference copy beside the checkout, ``../shared/peer-profiles/pipedream``, or None."""
    c = paths.REPO_ROOT.parent / "shared" / "peer-profiles" / "pipedream"
    return c if c.is_dir() else None

def test_nine_profiles_licence_and_origin_are_shipped():
    d = paths.PIPEDREAM_PROFILES_DIR
    assert sorted(p.parent.name for p in d.glob("*/graph.txt")) == sorted(NETS)
    assert "MIT License" in (d / "LICENSE.txt").read_text()
    readme = (d / "README.md").read_text()
    assert "msr-fiddle/pipedream" in readme and "7db6a1c" in readme


def test_names_resolve_to_the_shipped_copy_without_shared(monkeypatch, tmp_path):
    # a clone without ../shared and without the variable: the names still resolve, to data/profiles/pipedream
    monkeypatch.delenv("WORKBENCH_PEER_PROFILES", raising=False)
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path / "clone")  # no ../shared beside it
    assert shared_peer_profiles_dir() is None
    names = available_profiles()
    for net in NETS:
        assert names[f"pipedream/{net}"] == paths.PIPEDREAM_PROFILES_DIR / net / "graph.txt"
        assert resolve_profile(f"pipedream/{net}") == paths.PIPEDREAM_PROFILES_DIR / net / "graph.txt"
    chain = load_profile("pipedream/vgg16")
    assert len(chain) > 10 and chain.forward.sum() > 0
    from workbench.experiments import settings_for

    assert {f"pipedream/{n}" for n in NETS} <= set(settings_for().networks)  # reproduce's full run has them all


def test_the_variable_points_the_names_elsewhere(monkeypatch, tmp_path):
    (tmp_path / "vgg16").mkdir()
    (tmp_path / "vgg16" / "graph.txt").write_bytes((paths.PIPEDREAM_PROFILES_DIR / "vgg16" / "graph.txt").read_bytes())
    monkeypatch.setenv("WORKBENCH_PEER_PROFILES", str(tmp_path))
    names = available_profiles()
    assert names["pipedream/vgg16"] == tmp_path / "vgg16" / "graph.txt" and "pipedream/gnmt" not in names


@pytest.mark.skipif(shared_peer_profiles_dir() is None, reason="no ../shared/peer-profiles beside the checkout")
def test_shipped_copies_equal_the_shared_ones():
    shared = shared_peer_profiles_dir()
    for net in NETS:
        a, b = shared / net / "graph.txt", paths.PIPEDREAM_PROFILES_DIR / net / "graph.txt"
        assert filecmp.cmp(a, b, shallow=False), net
    assert filecmp.cmp(shared / "LICENSE.txt", paths.PIPEDREAM_PROFILES_DIR / "LICENSE.txt", shallow=False)

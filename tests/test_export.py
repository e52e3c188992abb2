"""Export: offline HTML always; PNG/SVG via kaleido when Chromium is there, a clear error when not."""

from pathlib import Path

import plotly.graph_objects as go
import pytest

from workbench.viz import export
from workbench.viz.export import INSTALL_HINT, ChromiumNotFound, find_chromium, save_html, save_image


def fig():
    return go.Figure(go.Bar(x=[1, 2], y=["GPU 0", "GPU 1"], base=[0, 1], orientation="h"))


def test_html_is_offline(tmp_path):
    p = save_html(fig(), tmp_path / "sub" / "f.html")
    text = p.read_text()
    assert "<html>" in text and "plotly.js" in text.lower()
    assert "cdn.plot.ly" not in text.split("<body>")[1][:2000]
    assert not list(tmp_path.glob("sub/*.tmp"))


def test_missing_chromium_message(tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-browser"))
    with pytest.raises(ChromiumNotFound) as e:
        save_image(fig(), tmp_path / "f.png")
    assert "make chromium" in str(e.value) and "apt-get install -y chromium" in str(e.value)
    monkeypatch.delenv("BROWSER_PATH")
    monkeypatch.setattr(export, "_CANDIDATES", ())
    monkeypatch.setattr(export.shutil, "which", lambda name: None)
    assert find_chromium() is None
    with pytest.raises(ChromiumNotFound, match="apt-get"):
        save_image(fig(), tmp_path / "f.png")
    assert "HTML" in INSTALL_HINT


def test_bad_format(tmp_path):
    with pytest.raises(ValueError, match="unsupported"):
        save_image(fig(), tmp_path / "f.bmp")


@pytest.mark.slow
@pytest.mark.skipif(find_chromium() is None, reason="Chromium not installed (make chromium)")
def test_png_and_svg(tmp_path):
    png = save_image(fig(), tmp_path / "f.png", width=400, height=300, scale=1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = save_image(fig(), tmp_path / "f.svg", width=400, height=300)
    assert svg.read_text().lstrip().startswith("<svg")

"""Export: offline HTML always; PNG/SVG via kaleido when Chromium is there, a clear error when not."""


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


KILLED_MID_EXPORT = """
import os, signal, sys
import plotly.graph_objects as go
import plotly.io as pio
from workbench.viz.export import save_html, save_images

what, folder = sys.argv[1], sys.argv[2]
fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))

def die_after_half(figs, files, **kw):  # kaleido writing the files one by one, killed in the middle
    for f in files[:1]:
        open(f, "wb").write(b"\\x89PNG partial")
    os.kill(os.getpid(), signal.SIGKILL)

def die_in_html(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)

pio.write_images = die_after_half
go.Figure.to_html = die_in_html
if what == "png":
    save_images([(fig, f"{folder}/a.png"), (fig, f"{folder}/b.png")])
else:
    save_html(fig, f"{folder}/a.html")
"""


@pytest.mark.parametrize("what", ["png", "html"])
def test_a_kill_mid_export_leaves_no_partial_or_empty_file(tmp_path, what):
    import os
    import signal
    import subprocess
    import sys

    from workbench.io import remove_orphans

    (tmp_path / f"a.{what}").write_bytes(b"the previous figure")
    env = {**os.environ, "BROWSER_PATH": "/bin/sh"}  # a file: the export gets as far as the writer
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_EXPORT, what, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    visible = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert visible == [f"a.{what}"] and (tmp_path / f"a.{what}").read_bytes() == b"the previous figure"
    assert remove_orphans(tmp_path)  # the next run cleans up what the killed one left
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"a.{what}"]

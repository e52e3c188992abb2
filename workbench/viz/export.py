"""Saving figures: offline HTML, and PNG/SVG/PDF through kaleido and Debian's Chromium.

:func:`save_html` writes a self-contained page (plotly.js embedded, works
without a network). :func:`save_image` renders with kaleido, which drives a
Chromium; it uses ``$BROWSER_PATH`` or ``/usr/bin/chromium`` (Debian's
package) and, when none is found, raises :class:`ChromiumNotFound` saying
how to install it (``make chromium`` or ``apt-get install -y chromium``).

>>> import plotly.graph_objects as go, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> save_html(go.Figure(go.Bar(x=[1], y=[2])), d / "f.html").stat().st_size > 1_000_000
True
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

__all__ = ["save_html", "save_image", "find_chromium", "ChromiumNotFound", "INSTALL_HINT"]

INSTALL_HINT = (
    "static image export needs Chromium (kaleido drives it). Install Debian's package with "
    "`make chromium` or `apt-get update && apt-get install -y chromium`, or point $BROWSER_PATH "
    "at a Chrome/Chromium executable. HTML export (save_html) needs no browser."
)
_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
_IMAGE_FORMATS = {"png", "svg", "pdf", "jpg", "jpeg", "webp"}


class ChromiumNotFound(RuntimeError):
    """No Chromium for kaleido; the message says how to install one."""


def find_chromium() -> str | None:
    """The Chromium kaleido should use: ``$BROWSER_PATH``, Debian's ``/usr/bin/chromium``, or one on PATH."""
    env = os.environ.get("BROWSER_PATH")
    if env:
        return env if Path(env).is_file() else None
    for c in _CANDIDATES:
        if Path(c).is_file() and os.access(c, os.X_OK):
            return c
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


def save_html(fig: go.Figure, path: str | Path, *, include_plotlyjs: bool | str = True) -> Path:
    """Write ``fig`` as a standalone HTML page (plotly.js included: opens offline). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pio.write_html(fig, tmp, include_plotlyjs=include_plotlyjs, full_html=True, auto_open=False)
    os.replace(tmp, path)
    return path


def save_image(fig: go.Figure, path: str | Path, *, format: str | None = None, width: int | None = None,
               height: int | None = None, scale: float = 2.0) -> Path:
    """Render ``fig`` to PNG, SVG or PDF (from the suffix, or ``format``) with kaleido + Chromium.

    Raises :class:`ChromiumNotFound` with installation instructions when no
    Chromium is available.
    """
    path = Path(path)
    fmt = (format or path.suffix.lstrip(".") or "png").lower()
    if fmt not in _IMAGE_FORMATS:
        raise ValueError(f"{path}: unsupported image format {fmt!r}; use one of {', '.join(sorted(_IMAGE_FORMATS))}")
    browser = find_chromium()
    if browser is None:
        if os.environ.get("BROWSER_PATH"):
            raise ChromiumNotFound(f"$BROWSER_PATH={os.environ['BROWSER_PATH']} is not a file; " + INSTALL_HINT)
        raise ChromiumNotFound(INSTALL_HINT)
    os.environ.setdefault("BROWSER_PATH", browser)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        pio.write_image(fig, path, format=fmt, width=width or fig.layout.width or 1000,
                        height=height or fig.layout.height or 500, scale=scale)
    except Exception as e:  # kaleido reports a missing/broken browser in several ways
        text = f"{type(e).__name__}: {e}"
        if "ChromeNotFound" in text or "Browser not found" in text or "Chrome" in type(e).__name__:
            raise ChromiumNotFound(f"kaleido could not start {browser}: {text}. " + INSTALL_HINT) from e
        raise
    return path

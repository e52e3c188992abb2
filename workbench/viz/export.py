"""Saving figures: offline HTML, and PNG/SVG/PDF through kaleido and Debian's Chromium.

:func:`save_html` writes a self-contained page (plotly.js embedded, works
without a network). :func:`save_image` renders with kaleido, which drives a
Chromium; it uses ``$BROWSER_PATH`` or ``/usr/bin/chromium`` (Debian's
package) and, when none is found, raises :class:`ChromiumNotFound` saying
how to install it (``make chromium`` or ``apt-get install -y chromium``).
:func:`save_images` renders many figures in one browser session. Every file
is written atomically (:func:`workbench.io.atomic_path`): a killed export
leaves the previous file or none, never a partial or 0-byte one.

>>> import plotly.graph_objects as go, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> save_html(go.Figure(go.Bar(x=[1], y=[2])), d / "f.html").stat().st_size > 1_000_000
True
"""

from __future__ import annotations

import os
import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import Sequence

import plotly.graph_objects as go
import plotly.io as pio

from workbench.io import atomic_path

__all__ = ["save_html", "save_image", "save_images", "find_chromium", "ChromiumNotFound", "INSTALL_HINT"]

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
    """Write ``fig`` as a standalone HTML page (plotly.js included: opens offline), atomically. Returns the path.

    ``include_plotlyjs="directory"`` refers to a ``plotly.min.js`` beside the page instead (written here if missing).
    """
    path = Path(path)
    if include_plotlyjs == "directory" and not (path.parent / "plotly.min.js").exists():
        from plotly.offline import get_plotlyjs

        from workbench.io import write_text_atomic

        write_text_atomic(path.parent / "plotly.min.js", get_plotlyjs())
    with atomic_path(path) as tmp:
        tmp.write_text(fig.to_html(include_plotlyjs=include_plotlyjs, full_html=True), encoding="utf-8")
    return path


def _browser() -> str:
    browser = find_chromium()
    if browser is None:
        if os.environ.get("BROWSER_PATH"):
            raise ChromiumNotFound(f"$BROWSER_PATH={os.environ['BROWSER_PATH']} is not a file; " + INSTALL_HINT)
        raise ChromiumNotFound(INSTALL_HINT)
    os.environ.setdefault("BROWSER_PATH", browser)
    return browser


def _format(path: Path, format: str | None) -> str:
    fmt = (format or path.suffix.lstrip(".") or "png").lower()
    if fmt not in _IMAGE_FORMATS:
        raise ValueError(f"{path}: unsupported image format {fmt!r}; use one of {', '.join(sorted(_IMAGE_FORMATS))}")
    return fmt


def _kaleido_error(e: Exception, browser: str) -> Exception:
    text = f"{type(e).__name__}: {e}"
    if "ChromeNotFound" in text or "Browser not found" in text or "Chrome" in type(e).__name__:
        return ChromiumNotFound(f"kaleido could not start {browser}: {text}. " + INSTALL_HINT)
    return e


def save_image(fig: go.Figure, path: str | Path, *, format: str | None = None, width: int | None = None,
               height: int | None = None, scale: float = 2.0) -> Path:
    """Render ``fig`` to PNG, SVG or PDF (from the suffix, or ``format``) with kaleido + Chromium, atomically.

    Raises :class:`ChromiumNotFound` with installation instructions when no
    Chromium is available.
    """
    return save_images([(fig, path)], format=format, width=width, height=height, scale=scale)[0]


def save_images(items: Sequence[tuple[go.Figure, str | Path]], *, format: str | None = None, width: int | None = None,
                height: int | None = None, scale: float = 2.0) -> list[Path]:
    """Render several ``(figure, path)`` pairs in one kaleido call (one browser start), each file atomically.

    All or nothing: if rendering fails no file is replaced.
    """
    if not items:
        return []
    paths = [Path(p) for _, p in items]
    fmts = [_format(p, format) for p in paths]
    browser = _browser()
    figs = [f for f, _ in items]
    with ExitStack() as stack:
        tmps = [stack.enter_context(atomic_path(p)) for p in paths]
        try:
            pio.write_images(figs, tmps, format=fmts, scale=scale,
                             width=[width or f.layout.width or 1000 for f in figs],
                             height=[height or f.layout.height or 500 for f in figs])
        except Exception as e:  # kaleido reports a missing/broken browser in several ways
            err = _kaleido_error(e, browser)
            if err is e:
                raise
            raise err from e
    return paths

"""End to end in a real browser: JupyterLab + the explorer notebook + headless Chromium (Playwright).

Starts ``jupyter-lab`` on loopback (a free port, a known token, its own
config/runtime dirs, on a copy of ``notebooks/04_explorer.ipynb`` so the
committed notebook is never written), opens the notebook, runs all cells,
checks that the widgets and the plotly charts rendered, drags the memory
slider and checks that the plan changed. Screenshots go to
``build/screenshots/``. Needs Debian's Chromium (``make chromium``).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "build" / "screenshots"
NOTEBOOK = ROOT / "notebooks" / "04_explorer.ipynb"
LAB = Path(sys.executable).parent / "jupyter-lab"
TOKEN = "workbench-browser-test"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

if not Path(CHROMIUM).is_file():
    pytest.skip(f"{CHROMIUM} not found: install Debian's Chromium with `make chromium` "
                "(apt-get install -y chromium)", allow_module_level=True)
playwright_sync = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
if not LAB.is_file():
    pytest.skip(f"{LAB} not found (JupyterLab is not installed in this environment)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def lab(tmp_path):
    """A JupyterLab server on a copy of the explorer notebook; yields its base URL and the notebook name."""
    work = tmp_path / "nb"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    port = _free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"), JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               WORKBENCH_QUICK="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # no "get notified about Jupyter news?" pop-up over the screenshots
    notif = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [str(LAB), "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={work}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly"] + (["--allow-root"] if os.geteuid() == 0 else []),
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.flush()
                pytest.fail(f"JupyterLab did not start:\n{(tmp_path / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, NOTEBOOK.name
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _summary(page) -> str:
    return page.locator(".wb-explorer .wb-summary").first.inner_text()


def test_explorer_in_jupyterlab(lab):
    base, name = lab
    SHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"{base}/lab/tree/{name}?token={TOKEN}", wait_until="domcontentloaded")
            page.wait_for_selector(".jp-Notebook", timeout=90_000)
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=60_000)
            page.evaluate("""async () => {
                const nb = window.jupyterapp.shell.currentWidget;
                await nb.sessionContext.ready;
                await window.jupyterapp.commands.execute('notebook:run-all-cells');
            }""")
            # the widgets and both plotly charts (Gantt, memory) rendered
            page.wait_for_selector(".wb-explorer .wb-summary", timeout=120_000)
            page.wait_for_function(
                "() => document.querySelectorAll('.wb-explorer .js-plotly-plot').length >= 2", timeout=120_000)
            page.wait_for_function(  # the second cell ran and printed the summary
                "() => [...document.querySelectorAll('.jp-OutputArea-output pre')]"
                ".some(e => e.innerText.includes('period'))",
                timeout=120_000)
            explorer = page.locator(".wb-explorer").first
            gantt = explorer.locator(".js-plotly-plot").first
            assert gantt.locator(".barlayer .point").count() > 10, "the Gantt chart has no bars"
            lanes = gantt.locator(".ytick text").all_text_contents()
            assert {"GPU 0", "GPU 1", "GPU 2", "GPU 3"} <= set(lanes), lanes
            for label in ("profile", "devices", "memory GiB", "bandwidth GB/s", "weights", "method"):
                assert explorer.get_by_text(label, exact=True).count() >= 1, label
            before = _summary(page)
            assert re.search(r"period\s+[\d.]+ m?s", before), before  # format_seconds: ms or s
            explorer.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "explorer_before.png"), full_page=False)

            # drag the memory slider's handle near the right end of its track
            slider = explorer.locator(".widget-slider", has_text="memory GiB").first
            track = slider.locator(".noUi-target, .slider-container").first
            handle = slider.locator(".noUi-handle").first
            handle.scroll_into_view_if_needed()
            readout_before = slider.locator(".widget-readout").inner_text()
            hb, tb = handle.bounding_box(), track.bounding_box()
            assert hb and tb
            page.mouse.move(hb["x"] + hb["width"] / 2, hb["y"] + hb["height"] / 2)
            page.mouse.down()
            page.mouse.move(tb["x"] + 0.9 * tb["width"], hb["y"] + hb["height"] / 2, steps=12)
            page.mouse.up()
            page.wait_for_function(
                "(old) => { const e = document.querySelector('.wb-explorer .wb-summary');"
                " return e && e.innerText !== old; }", arg=before, timeout=60_000)
            after = _summary(page)
            assert slider.locator(".widget-readout").inner_text() != readout_before
            assert after != before
            page.wait_for_function(
                "() => document.querySelectorAll('.wb-explorer .js-plotly-plot').length >= 2", timeout=60_000)
            assert explorer.locator(".js-plotly-plot").first.locator(".barlayer .point").count() > 10
            page.wait_for_timeout(800)  # let plotly finish drawing before the screenshot
            explorer.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "explorer_after.png"), full_page=False)
            explorer.screenshot(path=str(SHOTS / "explorer_widget.png"))
        except Exception:
            page.screenshot(path=str(SHOTS / "explorer_failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert (SHOTS / "explorer_after.png").stat().st_size > 10_000

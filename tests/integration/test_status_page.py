"""The dispatcher's status page, rendered by a real browser (headless Chromium).

The page's HTML holds no data: its script fetches /status.json and builds the tables, the
progress bars and the chart. So the checks below read the DOM after the script ran, which
fails if the script breaks, and a screenshot is saved (DATASERVICE_SCREENSHOT_DIR, if set,
receives a copy).
"""

from __future__ import annotations

import html.parser
import os
import shutil
import subprocess
import time

import pytest
import tensorflow as tf

import dataservice
from dataservice.local_cluster import LocalCluster

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
_NO_CHROMIUM = "no chromium on PATH (Debian: apt-get install -y chromium); the page is not rendered"


@pytest.fixture(autouse=True)
def chromium_present() -> None:
    """The page is rendered by a real browser or not at all: skipped without one, except under
    CI=true, where a page CI cannot render is a failure (.ci/run installs chromium)."""
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail(_NO_CHROMIUM)
        pytest.skip(_NO_CHROMIUM)


def chromium(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # tests may run as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--virtual-time-budget=6000",  # let the page's script fetch and render (3 refreshes)
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)


class _Dom(html.parser.HTMLParser):
    """The rendered page's table cells by section id, progress bars and chart lines."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, list[str]] = {}
        self.progress: list[str] = []
        self.polylines = 0
        self.texts: list[str] = []
        self._section: str | None = None
        self._in_cell = False
        self._skip = 0  # inside <script> or <style>

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "style"):
            self._skip += 1
        if tag == "div" and attrs.get("id") in ("jobs", "workers", "clients", "datasets"):
            self._section = attrs["id"]
        if tag == "td":
            self._in_cell = True
            self.cells.setdefault(self._section or "", []).append("")
        if attrs.get("role") == "progressbar":
            self.progress.append(attrs.get("aria-valuenow", ""))
        if tag == "polyline":
            self.polylines += 1

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_cell = False
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data):
        if self._skip:
            return
        self.texts.append(data)
        if self._in_cell and self._section:
            self.cells[self._section][-1] += data


def test_status_page_renders_in_chromium(tmp_path):
    with LocalCluster(
        2, processes=False, dispatcher_options={"monitoring_port": 0}, worker_options={"heartbeat_interval_ms": 200}
    ) as cluster:
        dataset = tf.data.Dataset.range(10**6).apply(
            dataservice.distribute("distributed_epoch", cluster.target, job_name="page")
        )
        iterator = iter(dataset)
        deadline = time.monotonic() + 6  # a few heartbeats' worth of reading, for rates and the chart
        while time.monotonic() < deadline:
            next(iterator)
        url = cluster.status_page_url
        assert url is not None
        dumped = chromium("--dump-dom", url)
        assert dumped.returncode == 0, dumped.stderr[-2000:]
        screenshot = tmp_path / "status_page.png"
        shot = chromium(f"--screenshot={screenshot}", "--window-size=1280,1100", "--hide-scrollbars", url)
        assert shot.returncode == 0 and screenshot.stat().st_size > 20_000, shot.stderr[-2000:]
        if os.environ.get("DATASERVICE_SCREENSHOT_DIR"):
            shutil.copy(screenshot, os.environ["DATASERVICE_SCREENSHOT_DIR"])
        workers = {w.address for w in cluster.workers}
        del iterator

    dom = _Dom()
    dom.feed(dumped.stdout)
    text = " ".join(dom.texts)
    assert "cannot reach the dispatcher" not in text
    # Workers: both addresses, alive, one active task each.
    worker_cells = dom.cells["workers"]
    assert workers <= set(worker_cells)
    for address in workers:
        row = worker_cells[worker_cells.index(address) : worker_cells.index(address) + 3]
        assert row[1:] == ["alive", "1"], row
    # The job and its running iteration, with a progress bar of the splits handed out.
    assert 'job 1 "page"' in text and "distributed_epoch" in text
    assert "running" in dom.cells["jobs"] and dom.progress
    # The client reading, and the chart of elements/s.
    assert dom.cells["clients"][:3] == ["1", "1", "1"]
    assert int(dom.cells["clients"][3]) > 0
    assert dom.polylines == 1
    assert dom.cells["datasets"][0] == "1"

"""The documentation site: ``mkdocs build --strict`` passes (a broken link, a missing reference or
a docstring that does not render fails it); the CLI reference lists every flag of the real
parsers and the Benchmarks page every recorded result; and the home page and a guide load in
headless Chromium (Debian's ``chromium`` and ``chromium-driver``, ``make chromium``) without
console errors and without fetching anything from another origin."""

from __future__ import annotations

import functools
import html
import os
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from taiji_harness import results
from taiji_harness.testing import REPO

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# headless, as root, with nothing reaching out to the network on its own
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
PAGES = {"index.html": "taiji", "guides/elastic-training.html": "Elastic training"}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-6000:]}"
    return out


def test_the_site_builds_strictly_with_generated_references(site):
    from taiji.launch.parser import build_parser

    cli = html.unescape((site / "reference" / "cli.html").read_text())
    run = next(a for a in build_parser()._actions if a.dest == "subcommand").choices["run"]
    flags = [flag for action in run._actions for flag in action.option_strings if flag.startswith("--")]
    assert len(flags) > 20
    assert [flag for flag in flags if flag not in cli] == []
    assert "taiji sched simulate" in cli and "taiji checkpoint export" in cli
    benchmarks = html.unescape((site / "benchmarks.html").read_text())
    for entry in results.load_all():
        assert entry["command"] in benchmarks
    api = (site / "reference" / "api.html").read_text()
    assert "taiji.Job" in api and "taiji.Optimizer" in api


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture
def server(site):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, name="docs-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture
def browser(tmp_path):
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} missing: `make chromium` (as root) installs Debian's chromium "
            "and chromium-driver"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium missing: pip install -e '.[docs]'")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(
        executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")
    )
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()  # ends chromium and chromedriver, and waits for chromedriver


@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_page_loads_in_chromium_without_console_errors(browser, server, page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server}/{page}")
    resources = (
        "return performance.getEntriesByType('resource').filter(e => e.responseEnd > 0).map(e => e.name)"
    )
    # the search index is fetched after the load event: wait for it, so that a failure there is seen too
    WebDriverWait(browser, 30).until(
        lambda d: any(name.endswith("search_index.json") for name in d.execute_script(resources))
    )
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text == PAGES[page]
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
    fetched = browser.execute_script(resources)
    assert [name for name in fetched if not name.startswith(server)] == []
    assert any(name.endswith(".css") for name in fetched)

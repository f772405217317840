"""The built site works in a real browser: home page, a reference page and the search.

Headless Chromium driven by Playwright's Python package. Playwright's own browser download
needs the network, so the test uses an installed Chromium (Debian's ``chromium`` package,
``$VISIONBLOCKS_CHROMIUM`` to point elsewhere) and skips, saying why, when there is none.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a headless browser on the built site

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def _chromium() -> str | None:
    for candidate in (os.environ.get("VISIONBLOCKS_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # the test reports problems itself
        pass


@pytest.fixture(scope="module")
def site_url(built_site: Path):
    """Serve the built site on a free localhost port (search needs http, not file://)."""
    handler = functools.partial(_QuietHandler, directory=str(built_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed: pip install -e '.[dev]'"
    )
    executable = _chromium()
    if executable is None:
        pytest.skip(
            "no Chromium found (apt-get install chromium, or set VISIONBLOCKS_CHROMIUM); "
            "Playwright's own browser download needs the network"
        )
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


# The only requests the site may make beyond its own server: the theme asks GitHub's API for
# the repository's stars and latest release (repo_url). The test runs offline, so those are
# refused, and the console errors they cause are not the site's.
ALLOWED_EXTERNAL = ("https://api.github.com/repos/",)


class PageProblems:
    """Console errors, uncaught exceptions and failed requests of one browser page."""

    def __init__(self, page, site_url: str):
        self.site_url = site_url
        self.errors: list[str] = []
        self.external: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"exception: {e}"))
        page.on("requestfailed", self._failed)
        page.on(
            "response",
            lambda r: r.url.startswith(site_url) and r.status >= 400
            and self.errors.append(f"HTTP {r.status}: {r.url}"),
        )  # fmt: skip

    def route(self, route) -> None:
        """Serve the site's own requests; refuse (and record) every other one."""
        url = route.request.url
        if url.startswith(self.site_url):
            route.continue_()
        else:
            self.external.append(url)
            route.abort()

    def _console(self, message) -> None:
        if message.type != "error":
            return
        source = (message.location or {}).get("url", "")
        if source.startswith(ALLOWED_EXTERNAL) and "Failed to load resource" in message.text:
            return
        self.errors.append(f"console: {message.text} ({source})")

    def _failed(self, request) -> None:
        if not request.url.startswith(ALLOWED_EXTERNAL):
            self.errors.append(f"request failed: {request.url}")

    def check(self) -> None:
        """Fail on any error, and on any request leaving the site but the allowed ones."""
        assert self.errors == []
        unexpected = [url for url in self.external if not url.startswith(ALLOWED_EXTERNAL)]
        assert unexpected == [], "the site requests other hosts"


@pytest.fixture
def page(browser, site_url):
    context = browser.new_context()
    opened = context.new_page()
    opened.problems = PageProblems(opened, site_url)
    context.route("**/*", opened.problems.route)
    yield opened
    context.close()


def test_home_page(page, site_url):
    page.goto(site_url, wait_until="networkidle")
    assert page.title().startswith("visionblocks")
    assert page.locator("h1").first.inner_text().strip().rstrip("¶") == "visionblocks"
    table = page.locator("table", has_text="Component")
    assert table.count() == 1 and table.locator("tbody tr").count() >= 15
    assert page.locator("a[href$='reference/losses/']").count() >= 1
    page.problems.check()


def test_reference_page_renders_entries_with_source_links(page, site_url):
    page.goto(site_url + "reference/losses/", wait_until="networkidle")
    heading = page.locator("[id='visionblocks.losses.focal.sigmoid_focal_loss']")
    assert heading.count() == 1 and "sigmoid_focal_loss" in heading.inner_text()
    signature = page.locator(".doc-signature").first.inner_text()
    assert signature.count("\n") >= 3, "the signature is not wrapped one parameter per line"
    source = heading.locator("a.vb-source-link")
    assert "/blob/" in source.get_attribute("href") and "focal.py#L" in source.get_attribute("href")
    page.problems.check()


def test_search_finds_a_function(page, site_url):
    page.goto(site_url, wait_until="networkidle")
    search = page.locator("input.md-search__input")
    search.click()
    search.press_sequentially("sigmoid_focal_loss", delay=20)  # key events, as a reader types
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=20_000)
    assert "sigmoid_focal_loss" in page.locator(".md-search-result").inner_text()
    page.problems.check()


def test_api_index_links_every_name(page, site_url):
    page.goto(site_url + "reference/api/", wait_until="networkidle")
    rows = page.locator("table tbody tr")
    assert rows.count() >= 200
    unlinked = page.locator("table tbody tr td:first-child:not(:has(a))")
    assert unlinked.count() == 0
    page.problems.check()

"""/docs and /redoc work with no internet: every asset comes from the service itself.

The browser tests render the pages in headless Chromium (Debian's, installed by `make
setup-browser`) on a real uvicorn, with every request to another host refused and recorded, and
read the operations off the rendered page as a person would. Where no Chromium is installed they
fail, saying how to install it: a skip would hide a blank page.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from pipeline.serving.routes_docs import ASSETS_URL
from tests.serving.conftest import app_of
from tests.serving.test_server import serving

pytestmark = pytest.mark.slow

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
# As this machine's probe ran Chromium: no sandbox as root, none of its own background traffic.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RENDER_TIMEOUT_MS = 30_000
OPERATIONS = {("POST", "/score"), ("POST", "/score/batch"), ("GET", "/health"), ("GET", "/ready"),
              ("POST", "/admin/reload")}


class _References(HTMLParser):
    """Every src and href of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def _references(html: str) -> list[str]:
    parser = _References()
    parser.feed(html)
    return parser.urls


@pytest.fixture
def docs_service(serving_config, make_service):
    """The service with no champion: the docs need none, and a model would only slow the test."""
    return make_service(serving_config)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_every_asset_a_docs_page_references_is_served_by_the_app(docs_service, page):
    with TestClient(app_of(docs_service), base_url="http://scoring.internal") as http:
        response = http.get(page)
        assert response.status_code == 200
        urls = _references(response.text) + re.findall(r"""url:\s*['"]([^'"]+)['"]""", response.text)
        assert any(ASSETS_URL in url for url in urls), urls  # the page does load its scripts from here
        for url in urls:
            absolute = urljoin(str(response.url), url)
            assert urlsplit(absolute).netloc == "scoring.internal", f"{page} loads {url} from another host"
            assert http.get(absolute).status_code == 200, f"{page} references {url}, which the app does not serve"
        assert "https://" not in response.text and "http://" not in response.text.replace("http://scoring.internal", "")


def _chromium() -> str:
    for name in CHROMIUM_CANDIDATES:
        if path := shutil.which(name):
            return path
    pytest.fail("no Chromium on this machine: run `make setup-browser` (Debian's chromium package)")


@pytest.fixture
def browser() -> Iterator:
    # Imported here: collecting the other tests of this package never loads playwright.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=_chromium(), headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _render_offline(browser, base_url: str, path: str, ready_selector: str):
    """Open ``path`` with every request outside ``base_url`` aborted; returns (page, refused URLs)."""
    context = browser.new_context()
    refused: list[str] = []

    def only_the_service(route) -> None:
        if route.request.url.startswith(base_url + "/"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", only_the_service)
    page = context.new_page()
    page.goto(base_url + path)
    page.wait_for_selector(ready_selector, timeout=RENDER_TIMEOUT_MS)
    return page, refused


def test_swagger_ui_lists_the_operations_with_no_network(docs_service, browser):
    with serving(docs_service) as base_url:
        page, refused = _render_offline(browser, base_url, "/docs", ".opblock-summary")
        listed = {(op.locator(".opblock-summary-method").inner_text().strip(),
                   op.locator(".opblock-summary-path").inner_text().strip().replace("\u200b", ""))
                  for op in page.locator(".opblock-summary").all()}
        page.context.close()
    assert OPERATIONS <= listed, listed
    assert refused == []


def test_redoc_lists_the_operations_with_no_network(docs_service, browser):
    with serving(docs_service) as base_url:
        spec = httpx.get(base_url + "/openapi.json").json()
        page, refused = _render_offline(browser, base_url, "/redoc", "[data-section-id^='operation/']")
        # ReDoc gives an operation's menu entry and its section the same data-section-id.
        sections = {path: page.locator(f"[data-section-id='operation/{spec['paths'][path]['post']['operationId']}']")
                    .count() for path in ("/score", "/score/batch")}
        text = page.inner_text("body")
        page.context.close()
    assert all(count >= 1 for count in sections.values()), f"ReDoc did not render the /score operations: {sections}"
    assert "/score/batch" in text
    assert refused == []

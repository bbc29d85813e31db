"""Browser tests: Playwright (sync API) driving Debian's Chromium against the real app under daphne.

Never a browser download: the tests use /usr/bin/chromium and are skipped, with that reason, when it
is missing. A failing test leaves a screenshot of each page it opened (and the page's console) in
its `artifacts` folder.
"""

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Error, Page, Playwright, sync_playwright

from accounts.models import User
from tests.support import WebServer

CHROMIUM = Path("/usr/bin/chromium")
SKIP_REASON = f"Chromium not installed at {CHROMIUM}"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 15_000
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.browser)
            if not CHROMIUM.exists():
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"report_{report.when}", report)  # read by `browse` to know whether the test failed
    return report


class Browse:
    """Pages of the real app, each in its own browser context (its own cookies).

    Chromium starts with the first page and stops with the test; Django code between browser
    steps runs inside `django_calls()`.
    """

    def __init__(self, server: WebServer) -> None:
        self.server = server
        self.playwright: Playwright | None = None
        self._browser: Browser | None = None
        self.contexts: list[BrowserContext] = []
        self.pages: list[tuple[str, Page]] = []
        self.console: list[str] = []

    def url(self, path: str) -> str:
        return self.server.url + path

    @property
    def browser(self) -> Browser:
        if self._browser is None:
            self.playwright = sync_playwright().start()
            self._browser = self.playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=LAUNCH_ARGS, headless=True
            )
        return self._browser

    def anonymous(self, name: str = "anonymous") -> Page:
        context = self.browser.new_context(viewport={"width": 1440, "height": 1000}, base_url=self.server.url)
        self.contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.on("console", lambda message: self.log(name, message))
        page.on("pageerror", lambda error: self.console.append(f"[{name}] page error: {error}"))
        self.pages.append((name, page))
        return page

    def as_user(self, user: User) -> Page:
        """A page signed in as user: a real session in the shared database, its cookie in the context."""
        with django_calls():
            client = Client()
            client.force_login(user)
        page = self.anonymous(user.username)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
        page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": self.server.url}])
        return page

    def log(self, name: str, message: ConsoleMessage) -> None:
        self.console.append(f"[{name}] {message.type}: {message.text}")

    def save_evidence(self, folder: Path) -> None:
        for i, (name, page) in enumerate(self.pages):
            try:
                page.screenshot(path=str(folder / f"failure-{i}-{name}.png"), full_page=True)
            except Error as exc:  # a closed page still lets the other screenshots be taken
                self.console.append(f"[{name}] no screenshot: {exc}")
        (folder / "browser-console.log").write_text("\n".join(self.console))

    def close(self) -> None:
        for context in self.contexts:
            context.close()
        if self._browser is not None:
            self._browser.close()
        if self.playwright is not None:
            self.playwright.stop()


@contextmanager
def django_calls() -> Iterator[None]:
    """Run Django code (queries, actions, their after-commit publishes) between browser steps.

    The sync Playwright API marks its asyncio loop as running in this thread between its calls,
    although the loop only runs inside them. Django's ORM and asgiref's async_to_sync refuse to
    run while a loop looks like it runs, so the mark is lifted here and put back after.
    """
    loop = asyncio._get_running_loop()
    asyncio._set_running_loop(None)
    try:
        yield
    finally:
        asyncio._set_running_loop(loop)


@pytest.fixture
def browse(web_server: WebServer, artifacts: Path, request: pytest.FixtureRequest) -> Iterator[Browse]:
    if not CHROMIUM.exists():
        pytest.skip(SKIP_REASON)
    session = Browse(web_server)
    yield session
    failed = any(getattr(request.node, f"report_{when}", None) and getattr(request.node, f"report_{when}").failed
                 for when in ("setup", "call"))  # fmt: skip
    if failed:
        session.save_evidence(artifacts)
    session.close()

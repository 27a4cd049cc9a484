"""Fixtures of the browser tests: one JupyterLab on a temporary course copy, headless Chromium.

- ``lab_server`` (session): the course copied into a temporary folder and served by
  ``jupyter lab`` with its own exchange, Jupyter folders and settings (see ``lab_server.py``);
  stopped, kernels included, at the end of the session.
- ``chromium`` (session): Debian's ``/usr/bin/chromium`` driven by Playwright. Without it the
  tests are skipped, except in CI (``CI`` set), where that is a failure.
- ``lab`` (per test): a new page, on a fresh JupyterLab workspace, wrapped in ``LabPage``.
- ``kept_lab`` (per test): one page kept from test to test, as a student keeps JupyterLab open
  and opens one lesson after another; a test that fails leaves it closed for the next one.
- ``released_assignment`` (session): the instructor's ``nbgrader generate_assignment`` and
  ``release_assignment`` of ``check_yourself`` in the course copy. Tests that must see the
  course before any release set ``RUNS_BEFORE_RELEASE = True`` in their module and run first.

Screenshots go to ``test-artifacts/browser/`` (git-ignored): the pages a test records as it
goes, and ``<test>__FAILED.png`` when a test fails. The server log is kept there too.
``BROWSER_TESTS_COURSE`` names another course folder to serve instead of this repository.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_page import LabPage
from lab_server import LabServer
from playwright.sync_api import BrowserContext, Page, Playwright

REPO = Path(__file__).resolve().parents[2]
# The course that is copied and served; another checkout can be named for trying the harness.
COURSE = Path(os.environ.get("BROWSER_TESTS_COURSE", REPO))
# Screenshots go here; BROWSER_ARTIFACTS names another folder (two runs at once keep their own).
ARTIFACTS = Path(os.environ.get("BROWSER_ARTIFACTS", REPO / "test-artifacts" / "browser"))
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ASSIGNMENT = "check_yourself"
VIEWPORT = {"width": 1400, "height": 900}


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """The screenshots folder, emptied of the previous run's screenshots."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    return ARTIFACTS


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    """Debian's chromium; a missing browser skips locally and fails in CI."""
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must install it", pytrace=False)
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture(scope="session")
def lab_server(
    chromium_path: Path, artifacts: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabServer]:
    """JupyterLab serving a temporary copy of the course; no process left after the session."""
    workdir = tmp_path_factory.mktemp("lab")
    server = LabServer.start(COURSE, workdir, artifacts / "jupyter-server.log")
    try:
        yield server
    finally:
        server.stop()
        leftover = server.leftover_processes()
        assert not leftover, f"processes left running after the server stopped: {leftover}"
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def chromium(
    chromium_path: Path, playwright: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrowserContext]:
    """One headless Chromium context for the session, with a profile folder of its own: pages
    share its HTTP cache and the code V8 compiled from JupyterLab's scripts, so only the first
    test downloads and compiles them (a page load then costs about a quarter less CPU than in
    a context without a profile); each test still opens its own page."""
    profile = tmp_path_factory.mktemp("chromium-profile")
    context = playwright.chromium.launch_persistent_context(
        str(profile),
        executable_path=str(chromium_path),
        args=CHROMIUM_ARGS,
        headless=True,
        viewport=VIEWPORT,
    )
    try:
        for blank in context.pages:  # the window a profile opens with
            blank.close()
        yield context
    finally:
        context.close()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def lab(
    chromium: BrowserContext,
    lab_server: LabServer,
    artifacts: Path,
    request: pytest.FixtureRequest,
) -> Iterator[LabPage]:
    """A new page on the course's JupyterLab (fresh workspace); its kernels end with the test."""
    page = chromium.new_page()
    lab_page = LabPage(page, lab_server, artifacts, request.node.name)
    request.node.lab_page = lab_page
    try:
        yield lab_page
    finally:
        page.close()
        lab_server.shutdown_kernels()


@pytest.fixture(scope="session")
def kept_page(chromium: BrowserContext) -> Iterator[list[Page]]:
    """The page of ``kept_lab`` while it is kept (an empty list until the first test opens it
    and after a failed test closed it)."""
    pages: list[Page] = []
    try:
        yield pages
    finally:
        for page in pages:
            page.close()


@pytest.fixture
def kept_lab(
    kept_page: list[Page],
    chromium: BrowserContext,
    lab_server: LabServer,
    artifacts: Path,
    request: pytest.FixtureRequest,
) -> Iterator[LabPage]:
    """Like ``lab``, but on a page kept from test to test: a test opens its notebook in the
    JupyterLab the page already shows (File ▸ Open from Path…, see ``LabPage.open_notebook``),
    and afterwards every tab is closed and every kernel ended. Loading JupyterLab costs a few
    seconds of CPU that the lessons' tests then pay once. After a failed test, or tabs that do
    not close, the page is closed, and the next test starts on a fresh one."""
    if not kept_page:
        kept_page.append(chromium.new_page())
    lab_page = LabPage(kept_page[0], lab_server, artifacts, request.node.name, keeps_lab=True)
    request.node.lab_page = lab_page
    try:
        yield lab_page
    finally:
        try:
            if getattr(request.node, "failed_in_browser", False):
                raise RuntimeError("the test failed: start the next one on a fresh page")
            lab_page.close_all_tabs()
        except Exception:  # noqa: BLE001 - any trouble here only costs the next test a page load
            kept_page.pop().close()
        lab_server.shutdown_kernels()


@pytest.fixture(scope="session")
def assignment() -> str:
    """The nbgrader assignment of the course."""
    return ASSIGNMENT


@pytest.fixture(scope="session")
def released_assignment(lab_server: LabServer, assignment: str) -> str:
    """The instructor generates and releases the assignment into the temporary exchange."""
    for command in (
        ("nbgrader", "generate_assignment", assignment, "--force"),
        ("nbgrader", "release_assignment", assignment, "--force"),
    ):
        result = lab_server.run(*command)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "| ERROR]" not in output, (
            f"{' '.join(command)} failed:\n{output}"
        )
    return assignment


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Among the browser tests, those of modules that say ``RUNS_BEFORE_RELEASE = True`` run
    first: they look at the course before the ``released_assignment`` fixture releases
    anything. The other tests of the session keep their places (the browser starts with the
    first browser test, not before the library's tests)."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in Path(item.path).parents]
    browser = sorted(
        (items[i] for i in slots),
        key=lambda item: not getattr(item.module, "RUNS_BEFORE_RELEASE", False),
    )
    for i, item in zip(slots, browser, strict=True):
        items[i] = item


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """On a failing test, save a screenshot of its page as ``<test>__FAILED.png``."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item.failed_in_browser = True  # type: ignore[attr-defined]
    lab_page = getattr(item, "lab_page", None)
    if report.failed and report.when in ("setup", "call") and lab_page is not None:
        path = lab_page.artifacts / f"{lab_page.test_name}__FAILED.png"
        try:
            lab_page.page.screenshot(path=str(path), full_page=True)
        except Exception as error:  # noqa: BLE001 - a failed screenshot must not hide the failure
            report.sections.append(("screenshot", f"no screenshot: {error}"))
        else:
            report.sections.append(("screenshot", str(path)))

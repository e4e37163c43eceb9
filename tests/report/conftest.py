"""Fixtures for report tests: synthetic run directories and one headless Chromium."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.report.synthetic import write_synthetic_run

CHROMIUM = os.environ.get("HARNESS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
XSS = "<script>alert(1)</script>"


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of one frozen synthetic trace (8 vs 12 slots) and a hostile one."""
    d = tmp_path_factory.mktemp("runs")
    write_synthetic_run(d / "slots8", num_requests=400, rate=3.0, seed=3, policy="fcfs8")
    write_synthetic_run(
        d / "slots12", num_requests=400, rate=3.0, seed=3, slots=12, policy="fcfs12"
    )
    write_synthetic_run(
        d / "hostile",
        num_requests=200,
        rate=2.0,
        seed=4,
        fail_fraction=0.1,
        error_text=XSS,
        model=XSS,
        policy=XSS,
        extra_meta={
            "label": XSS,
            "trace": {
                "source": "lmsys",
                "content_hash": "x",
                "meta": {"fallback": True, "reason": XSS, "notes": [f"prompt[0] = {XSS}"]},
            },
        },
    )
    return d


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium driven by Playwright (never downloads a browser).

    Module-scoped on purpose: Playwright's sync API keeps an asyncio loop running in this
    thread while it is started, which would break every async test collected after it."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed: run `bash scripts/setup-browser.sh`")
    sync_api = pytest.importorskip("playwright.sync_api")
    pw = sync_api.sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    except Exception as e:  # the browser truly cannot start here
        pw.stop()
        pytest.skip(f"headless Chromium cannot be launched: {str(e).splitlines()[0]}")
    yield b
    b.close()
    pw.stop()


class Opened:
    """A report opened in a page, with what the page did."""

    def __init__(self, page, errors: list[str], dialogs: list[str], requests: list[str]):
        self.page, self.errors, self.dialogs, self.requests = page, errors, dialogs, requests

    def figure_svg_counts(self) -> list[int]:
        return self.page.eval_on_selector_all(
            "div[data-fig]", "ds => ds.map(d => d.querySelectorAll('svg.main-svg').length)"
        )


@pytest.fixture
def open_report(browser):
    pages = []

    def _open(path: Path, width: int = 1300) -> Opened:
        page = browser.new_page(viewport={"width": width, "height": 900})
        pages.append(page)
        errors: list[str] = []
        dialogs: list[str] = []
        requests: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("request", lambda r: None if r.url.startswith("file:") else requests.append(r.url))
        page.goto(path.resolve().as_uri())
        page.wait_for_selector("body[data-rendered='1']", timeout=60_000)
        return Opened(page, errors, dialogs, requests)

    yield _open
    for p in pages:
        p.close()

"""A real headless Chromium (Debian's package, driven by Playwright) for the offline pages.

Without a browser the tests that need one are skipped, unless MINIGPT_REQUIRE_BROWSER=1 (.ci/run sets it
after installing Chromium), where a missing browser is a failure.
"""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import dataclass, field

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str | None:
    return next(filter(None, (shutil.which(name) for name in CANDIDATES)), None)


def require_browser():
    """The Playwright module and a Chromium executable, or skip (fail where a browser is required)."""
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if executable and sync_playwright:
        return sync_playwright, executable
    why = "no Chromium on PATH" if not executable else "playwright is not installed"
    if os.environ.get("MINIGPT_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{why}: the page tests need a real browser (apt-get install chromium; pip install -e '.[test]')")
    pytest.skip(f"{why} (set MINIGPT_REQUIRE_BROWSER=1 to make this a failure)")


@dataclass
class PageVisit:
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    text: str = ""
    chart_screenshots: list[bytes] = field(default_factory=list)
    custody_graphs: list[bytes] = field(default_factory=list)  # the run page's chain-of-custody drawing
    failed_rows: list[str] = field(default_factory=list)


def visit(path) -> PageVisit:
    """Open a file in headless Chromium; record every request, every console error, the text, the charts."""
    sync_playwright, executable = require_browser()
    seen = PageVisit()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("request", lambda request: seen.requests.append(request.url))
            page.on("console", lambda message: seen.console_errors.append(message.text)
                    if message.type in ("error", "warning") else None)
            page.on("pageerror", lambda error: seen.console_errors.append(str(error)))
            page.goto(path.resolve().as_uri(), wait_until="load")
            seen.text = page.inner_text("body")
            seen.chart_screenshots = [chart.screenshot() for chart in page.locator("svg.chart").all()]
            seen.custody_graphs = [graph.screenshot() for graph in page.locator("svg.custody-graph").all()]
            seen.failed_rows = [row.inner_text() for row in page.locator("tr.failed-row").all() if row.is_visible()]
        finally:
            browser.close()
    return seen


def pixels_near(png: bytes, colour: str, tolerance: int = 40) -> int:
    """Pixels within `tolerance` of a colour (#rrggbb) on every channel."""
    import numpy as np
    from PIL import Image

    target = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    return int((np.abs(pixels - target).max(axis=2) <= tolerance).sum())


def coloured_pixels(png: bytes) -> int:
    """Pixels that are clearly not grey: drawn series (axes, grid and text are greys)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    return int(((pixels.max(axis=2) - pixels.min(axis=2)) > 60).sum())

# A picture of the dashboard: headless Chromium from the system (the Debian
# `chromium` package) driven by Playwright from PyPI. Never `playwright install`:
# the browser is the system's, named by `executable_path`.
from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .._errors import MissingExtra

__all__ = ["BROWSER_ARGS", "find_chromium", "screenshot"]

# --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
BROWSER_ARGS = ("--no-sandbox", "--disable-dev-shm-usage")


def find_chromium() -> str | None:
    """The system Chromium: ``$STORMGUARD_CHROMIUM``, else ``chromium`` on the PATH."""
    named = os.environ.get("STORMGUARD_CHROMIUM")
    if named:
        return named if os.access(named, os.X_OK) else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


async def screenshot(url: str, path: Path, *, at: Callable[[], float], width: int = 1280) -> Path:
    """Open ``url`` now; at the ``time.monotonic()`` that ``at()`` names, save a PNG at ``path``."""
    try:
        from playwright.async_api import async_playwright
    except ImportError as exc:
        raise MissingExtra("playwright", "test") from exc
    executable = find_chromium()
    if executable is None:
        raise RuntimeError("no Chromium found (install the 'chromium' package)")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=executable, args=list(BROWSER_ARGS))
        try:
            page = await browser.new_page(viewport={"width": width, "height": 900})
            await page.goto(url)
            await asyncio.sleep(max(at() - time.monotonic(), 0.0))
            path.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(path), full_page=True)
        finally:
            await browser.close()
    return path

# A picture of the dashboard: headless Chromium from the system (the Debian
# `chromium` package) driven by Playwright from PyPI. Never `playwright install`:
# the browser is the system's, named by `executable_path`.
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from .._errors import MissingExtra

__all__ = ["BROWSER_ARGS", "Camera", "find_chromium"]

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


class Camera:
    """A headless system Chromium with the dashboard open, to photograph it later.

    ``async with Camera(url) as camera: ...; await camera.shoot(path)``. Opening the
    browser is the slow part (seconds on a busy machine), so it happens up front.
    """

    def __init__(self, url: str, *, width: int = 1280) -> None:
        self.url = url
        self.width = width
        self._stack = contextlib.AsyncExitStack()
        self._page: Any = None

    async def __aenter__(self) -> Camera:
        try:
            from playwright.async_api import async_playwright
        except ImportError as exc:
            raise MissingExtra("playwright", "test") from exc
        executable = find_chromium()
        if executable is None:
            raise RuntimeError("no Chromium found (install the 'chromium' package)")
        p = await self._stack.enter_async_context(async_playwright())
        browser = await p.chromium.launch(executable_path=executable, args=list(BROWSER_ARGS))
        self._stack.push_async_callback(browser.close)
        self._page = await browser.new_page(viewport={"width": self.width, "height": 900})
        await self._page.goto(self.url)
        return self

    async def shoot(self, path: Path) -> Path:
        """Save the whole page as a PNG at ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        await self._page.screenshot(path=str(path), full_page=True)
        return path

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

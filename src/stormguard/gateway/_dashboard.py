# The dashboard on the admin listener: one HTML page, one stylesheet and two small
# scripts (the page's, and its SVG charts), shipped as package data
# (stormguard/gateway/static/) and served as they are -- no build step, no CDN,
# nothing fetched from another origin (the Content-Security-Policy says so to the
# browser). The page polls /status and
# /history, which the admin listener builds from the merged metrics of every
# worker, so with --workers N it shows the whole gateway, not one process.
#
# The one contract with tests and scrapers (pinned): each upstream's breaker is an
# element with data-upstream="NAME" and data-breaker="closed|open|half_open" whose
# visible text names the state; each chart is an element with data-chart="NAME"
# (requests, refusals, answers:UPSTREAM, latency:UPSTREAM, breaker:UPSTREAM).
from __future__ import annotations

from functools import cache
from importlib import resources

from ..server._types import Send

__all__ = ["DASHBOARD_PATHS", "asset", "send_dashboard"]

_FILES = {
    "/": ("dashboard.html", b"text/html; charset=utf-8"),
    "/dashboard": ("dashboard.html", b"text/html; charset=utf-8"),
    "/dashboard/": ("dashboard.html", b"text/html; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", b"text/css; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", b"text/javascript; charset=utf-8"),
    "/dashboard-charts.js": ("dashboard-charts.js", b"text/javascript; charset=utf-8"),
}
DASHBOARD_PATHS = frozenset(_FILES)
_POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    b"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@cache
def asset(path: str) -> tuple[bytes, bytes]:
    """``(body, content type)`` of a dashboard path (one of :data:`DASHBOARD_PATHS`)."""
    name, content_type = _FILES[path]
    body = resources.files("stormguard.gateway").joinpath("static", name).read_bytes()
    return body, content_type


async def send_dashboard(send: Send, path: str) -> None:
    """Answer a GET of a dashboard path."""
    body, content_type = asset(path)
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-cache"),
        (b"content-security-policy", _POLICY),
        (b"x-content-type-options", b"nosniff"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})

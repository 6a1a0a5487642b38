# The admin listener of the rate-limit service: /metrics, /status, /healthz and
# /readyz are the gateway's admin app (wrapped, not copied) over this service's
# status builder; /dashboard is this service's own page.
#
# The page is rendered on the server from /status -- no script, nothing fetched from
# another origin -- and refreshes itself every two seconds. Its contract with tests
# and scrapers: one element per configured (or seen) descriptor carrying
# data-domain, data-descriptor, data-allowed, data-refused and data-shadow-refused,
# whose visible text says the same; one element per top limited value with
# data-value (the hashed value) and data-refused; and data-store="ok|unavailable".
from __future__ import annotations

from html import escape
from typing import Any

from ...server._types import Receive, Scope, Send
from .._app import AdminApp
from ._stats import RlsStatus

__all__ = ["DASHBOARD_PATHS", "RlsAdmin", "render_dashboard"]

DASHBOARD_PATHS = frozenset(("/", "/dashboard", "/dashboard/"))
_POLICY = (
    b"default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
    b"frame-ancestors 'none'"
)
_STYLE = (
    "body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;margin-bottom:1.5em}"
    "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}"
    "td:first-child,th:first-child{text-align:left}"
    ".refused{color:#b00}.shadow{color:#a60}"
)


def _attr(value: object) -> str:
    return escape(str(value), quote=True)


def render_dashboard(status: dict[str, Any]) -> str:
    """The dashboard page for a /status document."""
    store = status.get("store", "ok")
    rows = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<meta http-equiv='refresh' content='2'>",
        f"<title>stormguard ratelimit-service</title><style>{_STYLE}</style></head><body>",
        "<h1>stormguard ratelimit-service</h1>",
        f"<p>store: <strong data-store='{_attr(store)}'>{escape(store)}</strong>"
        f" &middot; answered: {int(status.get('requests_total', 0))}"
        f" &middot; in flight: {int(status.get('in_flight', 0))}</p>",
    ]
    for domain, row in sorted(status.get("domains", {}).items()):
        requests = row.get("requests", {})
        rows.append(
            f"<h2 data-domain-name='{_attr(domain)}'>{escape(domain)}</h2>"
            f"<p>ok: {int(requests.get('ok', 0))} &middot; over limit: "
            f"{int(requests.get('over_limit', 0))} &middot; unmatched descriptors: "
            f"{int(row.get('unmatched', 0))}</p>"
        )
        rows.append(
            "<table><tr><th>descriptor</th><th>allowed</th><th>refused</th>"
            "<th>shadow refused</th><th>top limited values (SHA-256 prefix)</th></tr>"
        )
        for label, cell in sorted(row.get("descriptors", {}).items()):
            allowed, refused = int(cell["allowed"]), int(cell["refused"])
            shadow = int(cell["shadow_refused"])
            top = " ".join(
                f"<span data-value='{_attr(v['value'])}' data-refused='{int(v['refused'])}'"
                f" data-shadow-refused='{int(v['shadow_refused'])}'>{escape(v['value'])}"
                f" ({int(v['refused']) + int(v['shadow_refused'])})</span>"
                for v in cell.get("top_limited", [])
            )
            rows.append(
                f"<tr data-domain='{_attr(domain)}' data-descriptor='{_attr(label)}'"
                f" data-allowed='{allowed}' data-refused='{refused}'"
                f" data-shadow-refused='{shadow}'><td>{escape(label)}</td><td>{allowed}</td>"
                f"<td class='refused'>{refused}</td><td class='shadow'>{shadow}</td>"
                f"<td>{top}</td></tr>"
            )
        rows.append("</table>")
    rows.append("</body></html>")
    return "\n".join(rows)


class RlsAdmin:
    """The admin ASGI app: the gateway's :class:`AdminApp` plus this service's dashboard."""

    def __init__(self, status: RlsStatus, ready: Any = None) -> None:
        self.status = status
        self._inner = AdminApp(status, ready)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in DASHBOARD_PATHS:
            body = render_dashboard(self.status.status()).encode()
            headers = [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-cache"),
                (b"content-security-policy", _POLICY),
                (b"x-content-type-options", b"nosniff"),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self._inner(scope, receive, send)

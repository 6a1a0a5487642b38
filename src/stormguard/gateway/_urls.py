# Credentials in an upstream URL (`http://user:pw@host:port/base`): they become the
# `Authorization: Basic` of every request to it (replacing any the client sent, as
# nginx's `proxy_set_header Authorization` does), `Host` is host[:port] alone, and
# the URL is shown -- /status, the dashboard, logs, errors -- with the userinfo
# replaced by `***` (`shown_url`). Nothing else in the gateway reads the userinfo.
from __future__ import annotations

import base64
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["shown_url", "split_userinfo"]


def split_userinfo(url: str) -> tuple[str, bytes | None]:
    """``url`` without its userinfo, and the ``Authorization`` value it stands for
    (``Basic base64(user:password)``, percent-decoded, UTF-8), or None without one."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return url, None
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode())
    plain = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return plain, b"Basic " + token


def shown_url(url: str) -> str:
    """``url`` as it may be shown: any userinfo replaced by ``***``."""
    parts = urlsplit(url)
    _, at, hostport = parts.netloc.rpartition("@")
    if not at:
        return url
    return urlunsplit((parts.scheme, "***@" + hostport, parts.path, parts.query, parts.fragment))

"""MkDocs hook: docstrings' Sphinx roles (:class:`X`, :func:`f` ...) shown as plain code.

The API reference renders the package's docstrings, which are written for ``help()``
and IDEs in reST style. Markdown keeps ``:class:`` in front of the code span; this hook
drops the role name so the page reads ``RetryPolicy`` instead of ``:class:RetryPolicy``.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|attr|exc|data|mod|obj|const):(?=<code)")


def on_page_content(html: str, **kwargs: Any) -> str:
    """Remove reST role prefixes in front of code spans."""
    return _ROLE.sub("", html)

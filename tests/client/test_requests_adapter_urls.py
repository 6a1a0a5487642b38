"""RetryAdapter's own parts of HTTPAdapter's work: the request URL kept per URL
when no proxy is given, and urllib3 Timeout objects capped by the deadline."""

from __future__ import annotations

import pytest
import requests
from http_support import ScriptedServer, Step
from hypothesis import given
from hypothesis import strategies as st
from requests.adapters import HTTPAdapter
from urllib3.util import Timeout

from stormguard import RetryPolicy
from stormguard.client import _requests as requests_module
from stormguard.client._requests import _cap_timeout
from stormguard.protection import OriginGuards
from stormguard.requests import RetryAdapter

_SEGMENT = st.text(alphabet="abcxyz019-._~%!$&'()*+,;=:@", min_size=0, max_size=8)
_URLS = st.builds(
    lambda scheme, host, port, segments, query: (
        f"{scheme}://{host}{port}/{'/'.join(segments)}{query}"
    ),
    st.sampled_from(["http", "https"]),
    st.sampled_from(["api.test", "127.0.0.1", "user:pw@api.test", "[::1]"]),
    st.sampled_from(["", ":8080", ":443"]),
    st.lists(_SEGMENT, max_size=4),
    st.sampled_from(["", "?a=1", "?a=1&b=%20x", "?", "#frag", "?q=1#f"]),
)


def _prepared(url: str) -> requests.PreparedRequest:
    return requests.Request("GET", url).prepare()


@given(url=_URLS, proxies=st.sampled_from([None, {}]))
def test_the_request_url_is_httpadapters_own_first_and_kept(url: str, proxies: object) -> None:
    """Without proxies the answer is HTTPAdapter.request_url's, asked once per URL."""
    adapter, plain = RetryAdapter(guards=OriginGuards()), HTTPAdapter()
    request = _prepared(url)
    expected = plain.request_url(request, proxies)  # type: ignore[arg-type]
    assert adapter.request_url(request, proxies) == expected
    assert adapter._paths == {request.url: expected}
    assert adapter.request_url(_prepared(url), proxies) == expected  # from the map


def test_with_a_proxy_the_full_url_is_asked_each_time() -> None:
    """A proxied plain-HTTP request is sent with its whole URL, and none is kept."""
    adapter = RetryAdapter(guards=OriginGuards())
    request = _prepared("http://api.test/a?b=1")
    proxies = {"http": "http://proxy.test:3128"}
    assert adapter.request_url(request, proxies) == HTTPAdapter().request_url(request, proxies)
    assert adapter.request_url(request, proxies) == "http://api.test/a?b=1"
    assert adapter._paths == {}


def test_the_kept_urls_are_bounded() -> None:
    adapter = RetryAdapter(guards=OriginGuards())
    limit = requests_module._MAX_PATHS
    for i in range(limit * 2 + 5):
        url = f"http://api.test/item/{i}?v={i}"
        assert adapter.request_url(_prepared(url), None) == f"/item/{i}?v={i}"
        assert len(adapter._paths) <= limit


def test_a_subclass_request_url_is_used(server: ScriptedServer) -> None:
    """request_url stays HTTPAdapter's hook: a subclass that overrides it is obeyed."""
    server.script(Step(200))
    asked: list[str] = []

    class Rewriting(RetryAdapter):
        def request_url(self, request: requests.PreparedRequest, proxies: object) -> str:
            asked.append(request.url or "")
            return "/rewritten"

    with requests.Session() as session:
        session.mount("http://", Rewriting(guards=OriginGuards()))
        assert session.get(server.url + "/x", timeout=10).status_code == 200
    assert asked == [server.url + "/x"]
    assert server.received[0].path == "/rewritten"


def test_a_urllib3_timeout_is_taken(server: ScriptedServer) -> None:
    """requests passes a urllib3 Timeout to urllib3 as it is; so does RetryAdapter."""
    server.script(Step(200))
    with requests.Session() as session:
        session.mount("http://", RetryAdapter(guards=OriginGuards()))
        response = session.get(server.url, timeout=Timeout(connect=5, read=5))
    assert response.status_code == 200


def test_a_urllib3_timeout_within_the_deadline_is_left_alone() -> None:
    for timeout in (Timeout(connect=1, read=2), Timeout(total=3), Timeout(connect=9, total=2)):
        assert _cap_timeout(timeout, 5.0) is timeout


@pytest.mark.parametrize(
    ("timeout", "total"),
    [
        (Timeout(connect=30, read=30), 2.0),
        (Timeout(connect=1, read=None), 2.0),
        (Timeout(total=10), 2.0),
        (Timeout(connect=1, read=1, total=1.5), 1.5),
    ],
)
def test_a_deadline_caps_a_urllib3_timeouts_total(timeout: Timeout, total: float) -> None:
    """No attempt outlives the deadline: the Timeout's total becomes the time left."""
    capped = _cap_timeout(timeout, 2.0)
    assert isinstance(capped, Timeout)
    if total == 1.5:
        assert capped is timeout
    else:
        assert capped is not timeout
        assert capped.total == total
        assert (capped._connect, capped._read) == (timeout._connect, timeout._read)


def test_without_a_deadline_a_urllib3_timeout_is_passed_on() -> None:
    timeout = Timeout(connect=30, read=30)
    assert _cap_timeout(timeout, float("inf")) is timeout
    assert RetryPolicy(deadline=None).deadline_s == float("inf")

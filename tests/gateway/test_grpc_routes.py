"""The gRPC leg's routes, request view and channel targets (no servers)."""

from __future__ import annotations

import pytest

from stormguard import ConfigError
from stormguard.gateway._clients import ClientIdentity
from stormguard.gateway._grpc_gateway import pushback
from stormguard.gateway._grpc_routes import GrpcRoute, RouteTable, target_of
from stormguard.server._grpc import _CallView

UPSTREAMS = {"a": object(), "b": object()}


@pytest.mark.parametrize(
    ("match", "field"),
    [("", "grpc"), ("/pkg.S", "grpc"), ("pkg.S/", "grpc"), ("pkg.S/M/x", "grpc")],
)
def test_bad_route_match_names_the_field(match: str, field: str) -> None:
    """A route must be SERVICE or SERVICE/METHOD."""
    with pytest.raises(ConfigError) as caught:
        GrpcRoute(match, "a")
    assert caught.value.field == field


def test_bad_refuse_with_names_the_field() -> None:
    """refuse_with is unavailable or resource_exhausted."""
    with pytest.raises(ConfigError) as caught:
        GrpcRoute("pkg.S", "a", refuse_with="teapot")  # type: ignore[arg-type]
    assert caught.value.field == "refuse_with"


@pytest.mark.parametrize(
    ("method", "upstream"),
    [
        ("/pkg.S/Special", "b"),
        ("/pkg.S/Other", "a"),
        ("/pkg.T/Special", None),
        ("pkg.S/Special", "b"),
    ],
)
def test_method_route_beats_service_route(method: str, upstream: str | None) -> None:
    """service/method wins over service; other services match nothing."""
    table = RouteTable([GrpcRoute("pkg.S", "a"), GrpcRoute("pkg.S/Special", "b")], UPSTREAMS)
    route = table.resolve(method)
    assert (route.upstream if route is not None else None) == upstream


@pytest.mark.parametrize(
    ("routes", "field"),
    [
        ([GrpcRoute("pkg.S", "nowhere")], "routes.0.upstream"),
        ([GrpcRoute("pkg.S", "a"), GrpcRoute("pkg.S", "b")], "routes.1.grpc"),
    ],
)
def test_route_table_rejects_unknown_upstreams_and_repeats(
    routes: list[GrpcRoute], field: str
) -> None:
    """An unknown upstream or a match routed twice is a ConfigError naming the route."""
    with pytest.raises(ConfigError) as caught:
        RouteTable(routes, UPSTREAMS)
    assert caught.value.field == field


class Context:
    """The two things of a grpc.aio servicer context the call view reads."""

    def __init__(self, metadata: tuple[tuple[str, str | bytes], ...], peer: str) -> None:
        self._metadata, self._peer = metadata, peer

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """Request metadata."""
        return self._metadata

    def peer(self) -> str:
        """The peer string."""
        return self._peer


@pytest.mark.parametrize(
    ("metadata", "key"),
    [
        ((("x-api-key", "k1"),), "h:x-api-key:k1"),
        ((), "ip:10.1.2.3"),
    ],
)
def test_the_gateway_identity_names_a_grpc_client(
    metadata: tuple[tuple[str, str], ...], key: str
) -> None:
    """The gateway's clients.key list reads metadata first, then the peer ip."""
    identity = ClientIdentity(["header:x-api-key", "ip"], [])
    view = _CallView({}, Context((*metadata, ("x-id-bin", b"\x00")), "ipv4:10.1.2.3:999"))
    assert identity.identify(view)[1] == key


@pytest.mark.parametrize(
    "urls", [["http://127.0.0.1:80"], ["grpc://host"], ["grpc://a.example:1", "grpc://b:2"]]
)
def test_bad_grpc_targets_are_config_errors(urls: list[str]) -> None:
    """Only grpc://HOST:PORT; several targets must be IPv4 addresses."""
    with pytest.raises(ConfigError):
        target_of(urls)


@pytest.mark.parametrize(
    ("seconds", "millis"), [(0.2, "200"), (1.0001, "1001"), (-1.0, "0"), (float("inf"), "-1")]
)
def test_pushback_is_whole_milliseconds_rounded_up(seconds: float, millis: str) -> None:
    """A client obeying the pushback never comes back early."""
    assert pushback(seconds) == (("grpc-retry-pushback-ms", millis),)

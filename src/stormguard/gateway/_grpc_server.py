# Starting and stopping the gRPC listener of the gateway.
#
# The listener is a grpc.aio server with one generic handler (GrpcGateway) and no
# services of its own. It runs on the gateway's event loop, beside the HTTP leg.
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc.aio

from .._errors import ConfigError
from ._grpc_gateway import Count, GrpcGateway
from ._grpc_routes import GrpcRoute
from ._upstream import UpstreamPool

__all__ = ["GrpcProxyServer", "start_grpc_proxy"]


class GrpcProxyServer:
    """A running gRPC listener: ``port``, ``gateway`` (routes, stats) and :meth:`stop`."""

    def __init__(self, server: grpc.aio.Server, gateway: GrpcGateway, port: int) -> None:
        self.server = server
        self.gateway = gateway
        self.port = port

    @property
    def stats(self) -> dict[str, Counter[str]]:
        """Per route service name: ``allowed`` and refusal reasons."""
        return self.gateway.stats

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting; let calls in flight finish for ``grace`` seconds; close upstreams."""
        await self.server.stop(grace)
        await self.gateway.close()


async def start_grpc_proxy(
    listen: str,
    *,
    routes: Iterable[GrpcRoute],
    upstreams: Mapping[str, UpstreamPool],
    client_keys: Sequence[str] = ("ip",),
    trusted_proxies: Sequence[str] = (),
    count: Count | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> GrpcProxyServer:
    """Serve the ``grpc:`` routes on ``listen`` (``HOST:PORT``; port 0 picks a free one).

    ``upstreams`` maps names to the gateway's :class:`UpstreamPool` objects (the
    ones the HTTP leg uses: one breaker, bulkhead and budget per upstream);
    ``client_keys``/``trusted_proxies`` are the gateway's ``clients`` section;
    ``count(route, outcome)`` is the gateway's metrics counter (default: the
    listener's own :attr:`GrpcProxyServer.stats`). ``options`` go to grpc's server.
    """
    gateway = GrpcGateway(
        routes=routes,
        upstreams=upstreams,
        client_keys=client_keys,
        trusted_proxies=trusted_proxies,
        count=count,
    )
    server = grpc.aio.server(options=list(options))
    server.add_generic_rpc_handlers((gateway,))
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise ConfigError("listen.grpc", f"cannot listen on {listen!r}: {exc}") from None
    await server.start()
    return GrpcProxyServer(server, gateway, port)

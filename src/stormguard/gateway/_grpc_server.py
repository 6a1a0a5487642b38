# Starting and stopping the gRPC listener of the gateway.
#
# The listener is a grpc.aio server with one generic handler (GrpcGateway) and no
# services of its own. In `stormguard gateway` it runs on the gateway's event loop
# beside the HTTP leg (start_gateway_grpc): same Runtime, so the same upstream
# pools (breakers, bulkheads, budgets), the same store, client identity and
# metrics; after a reload the next call sees the new routes. With --workers N
# every worker listens on `listen.grpc` (grpc sets SO_REUSEPORT; the kernel
# spreads connections). start_grpc_proxy serves hand-built routes (tests, embedding).
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from .._errors import ConfigError
from ._clients import ClientIdentity, client_id
from ._grpc_gateway import GrpcGateway, Record
from ._grpc_routes import GrpcRoute
from ._upstream import UpstreamPool

if TYPE_CHECKING:
    from ._app import Gateway
    from ._runtime import Runtime

__all__ = ["GrpcProxyServer", "grpc_routes", "start_gateway_grpc", "start_grpc_proxy"]


class GrpcProxyServer:
    """A running gRPC listener: ``port``, ``gateway`` (routes, stats) and :meth:`stop`."""

    def __init__(self, server: grpc.aio.Server, gateway: GrpcGateway, port: int) -> None:
        self.server = server
        self.gateway = gateway
        self.port = port

    @property
    def stats(self) -> dict[str, Counter[str]]:
        """Per route: ``allowed`` and refusal reasons (when no ``record`` was given)."""
        return self.gateway.stats

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting; let calls in flight finish for ``grace`` seconds; close upstreams."""
        await self.server.stop(grace)
        await self.gateway.close()


async def _serve(
    gateway: GrpcGateway, listen: str, options: Sequence[tuple[str, Any]]
) -> GrpcProxyServer:
    server = grpc.aio.server(options=list(options))
    server.add_generic_rpc_handlers((gateway,))
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise ConfigError("listen.grpc", f"cannot listen on {listen!r}: {exc}") from None
    await server.start()
    return GrpcProxyServer(server, gateway, port)


async def start_grpc_proxy(
    listen: str,
    *,
    routes: Iterable[GrpcRoute],
    upstreams: Mapping[str, UpstreamPool],
    client_keys: Sequence[str] = ("ip",),
    trusted_proxies: Sequence[str] = (),
    record: Record | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> GrpcProxyServer:
    """Serve ``routes`` on ``listen`` (``HOST:PORT``; port 0 picks a free one).

    ``upstreams`` maps names to :class:`UpstreamPool` objects (one breaker,
    bulkhead and budget per upstream, shared with the HTTP leg when the gateway
    runs both); ``client_keys``/``trusted_proxies`` are the gateway's ``clients``
    section; ``record(route, outcome, client)`` is told every call's outcome
    (default: the listener's own :attr:`GrpcProxyServer.stats`). ``options`` go to
    grpc's server.
    """
    identity = ClientIdentity(client_keys, trusted_proxies)
    gateway = GrpcGateway(routes=routes, upstreams=upstreams, identity=identity, record=record)
    return await _serve(gateway, listen, options)


def grpc_routes(runtime: Runtime, instances: int) -> list[GrpcRoute]:
    """The ``grpc:`` routes of a gateway runtime, limits compiled as the HTTP routes' are."""
    config = runtime.config
    routes = []
    for route in config.routes:
        if route.grpc is not None:
            # The HTTP leg's compiler builds the route's RuleSet on the runtime's store.
            compiled = runtime._compile(route, config, instances)
            routes.append(
                GrpcRoute(
                    route.grpc,
                    route.upstream,
                    compiled.rules,
                    route.refuse_with,
                    classify=compiled.classify,
                )
            )
    return routes


class _GatewayLeg(GrpcGateway):
    # The gRPC leg of a running `stormguard gateway`: follows its runtime swaps and
    # counts in its metrics.

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._runtime = runtime = gateway.runtime
        super().__init__(
            routes=grpc_routes(runtime, self._instances(runtime)),
            upstreams=runtime.upstreams,
            identity=runtime.identity,
            record=self._count,
            access_log=runtime.config.access_log,
        )

    def _instances(self, runtime: Runtime) -> int:
        return runtime.config.instances or self._gateway.workers

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        runtime = self._gateway.runtime
        if runtime is not self._runtime:  # reloaded: calls from now on see the new routes
            self._runtime = runtime
            self.identity = runtime.identity
            self.access_log = runtime.config.access_log
            self.update(grpc_routes(runtime, self._instances(runtime)), runtime.upstreams)
        return super().service(handler_call_details)

    def _count(self, route: str, outcome: str, client: str) -> None:
        metrics = self._gateway.metrics
        metrics.count(route, outcome)
        if outcome != "allowed":
            metrics.refused_clients.labels(client_id(client), outcome).inc()


async def start_gateway_grpc(gateway: Gateway) -> GrpcProxyServer | None:
    """Start the gRPC leg of a running gateway on ``listen.grpc`` (None when not set)."""
    config = gateway.runtime.config
    if config.listen.grpc is None:
        return None
    # A request message may be as large as an HTTP body (`max_body`); answers pass.
    options = [
        ("grpc.max_receive_message_length", config.max_body),
        ("grpc.max_send_message_length", -1),
    ]
    return await _serve(_GatewayLeg(gateway), config.listen.grpc, options)

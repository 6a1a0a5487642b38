# The running service: its options, the configuration as a live Decider (swapped
# whole on reload), the store, the metrics, and the gRPC method handler.
#
# `RateLimitService.decider` is the one mutable reference: a reload validates every
# file, builds a new Decider on the same store and assigns it; a call reads it once
# on arrival, so no call sees half of two configurations. Limiter state lives in the
# store under names that survive a reload (see _config.LimitSpec.store_name).
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from ..._errors import ConfigError
from ...limiting._limiter import OnStoreError
from ...server._refusal import HeaderStyle, check_style
from ...stores import MemoryStore, from_url
from .._config import GatewayConfigError, split_hostport
from ._config import Domain, load_domains
from ._decide import Decider, RequestError
from ._pb import rls_pb2
from ._stats import RlsMetrics

__all__ = ["METHOD", "SERVICE", "RateLimitService", "ServiceOptions"]

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
METHOD = f"/{SERVICE}/ShouldRateLimit"
_MODES = ("open", "closed", "local")
log = logging.getLogger("stormguard.ratelimit")


@dataclass(frozen=True, slots=True)
class ServiceOptions:
    """What the command line says, validated once (``ConfigError`` naming the flag).

    ``headers`` is ``ietf``, ``github``, ``both`` or ``none``; ``instances`` (default:
    ``workers``) is what ``on_store_error="local"`` divides limits by.
    """

    listen: str = "127.0.0.1:8081"
    admin: str | None = "127.0.0.1:6070"
    store: str = "memory"
    workers: int = 1
    on_store_error: OnStoreError = "local"
    instances: int | None = None
    headers: str = "ietf"
    drain: float = 10.0
    store_prefix: str = "stormguard:"
    store_timeout: float = 0.25

    def __post_init__(self) -> None:
        for name in ("listen", "admin"):
            value = getattr(self, name)
            if value is not None:
                try:
                    split_hostport(value)
                except ValueError as exc:
                    raise ConfigError(name, str(exc)) from None
        if not isinstance(self.store, str) or not self.store:
            raise ConfigError("store", "must be 'memory' or a store URL (redis://...)")
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError("workers", f"must be an integer >= 1, got {self.workers!r}")
        if self.workers > 1 and not self.shared_store:
            raise ConfigError(
                "workers",
                f"store 'memory' cannot be shared by {self.workers} workers; "
                "use a redis:// store or --workers 1",
            )
        if self.on_store_error not in _MODES:
            raise ConfigError("on_store_error", f"must be one of {_MODES}")
        if self.instances is not None and self.instances < 1:
            raise ConfigError("instances", f"must be >= 1, got {self.instances!r}")
        if self.headers != "none":
            check_style(self.headers)
        if not 0 <= self.drain < 3600:
            raise ConfigError("drain", f"must be 0 to 3600 seconds, got {self.drain!r}")
        if not 0 < self.store_timeout <= 60:
            raise ConfigError("store_timeout", f"must be > 0 and <= 60, got {self.store_timeout}")

    @property
    def shared_store(self) -> bool:
        """Whether the state lives where other processes see it (Redis)."""
        return self.store != "memory" and not self.store.startswith("memory:")

    @property
    def header_style(self) -> HeaderStyle | None:
        """``headers`` for the Decider (None: no ``response_headers_to_add``)."""
        return None if self.headers == "none" else check_style(self.headers)


def open_store(options: ServiceOptions) -> Any:
    """The async store the options name (a MemoryStore for ``memory``)."""
    if not options.shared_store:
        return MemoryStore()
    return from_url(  # ConfigError naming "url" for a scheme it does not know
        options.store,
        asyncio=True,
        prefix=options.store_prefix,
        instances=options.instances or options.workers,
        socket_timeout=options.store_timeout,
        connect_timeout=options.store_timeout,
    )


class RateLimitService:
    """``envoy.service.ratelimit.v3.RateLimitService`` over the configured domains."""

    def __init__(self, paths: Sequence[str | Path], options: ServiceOptions) -> None:
        self.paths = list(paths)
        self.options = options
        self.metrics = RlsMetrics()
        self.store = open_store(options)
        self.decider = self._decider(load_domains(self.paths))
        self.metrics.store_state = lambda: self.decider.store_down
        self.ready = False

    def _decider(self, domains: dict[str, Domain]) -> Decider:
        return Decider(
            domains,
            self.store,
            on_store_error=self.options.on_store_error,
            instances=self.options.instances or self.options.workers,
            headers=self.options.header_style,
            record=self.metrics.record,
        )

    @property
    def descriptors(self) -> dict[str, list[str]]:
        """Each domain's configured descriptor labels (for /status)."""
        return {
            name: [spec.label for spec in domain.limits()]
            for name, domain in self.decider.domains.items()
        }

    def reload(self) -> bool:
        """Validate every file and swap; on any error keep the running configuration."""
        try:
            domains = load_domains(self.paths)
        except GatewayConfigError as exc:
            log.error("reload refused; keeping the running configuration:\n%s", exc)
            return False
        self.decider = self._decider(domains)
        log.warning("reloaded %d domain(s) from %d file(s)", len(domains), len(self.paths))
        return True

    def flush(self) -> None:
        """Publish the gathered counts and the store's state."""
        self.metrics.flush()

    async def should_rate_limit(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The ShouldRateLimit method."""
        metrics = self.metrics
        metrics.in_flight += 1
        try:
            response = await self.decider.decide(request)
        except RequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            metrics.in_flight -= 1
        over = response.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
        code = "over_limit" if over else "ok"
        domain = request.domain if request.domain in self.decider.domains else "(unknown)"
        metrics.answered(domain, code)
        return response

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler serving :data:`METHOD`."""
        method = grpc.unary_unary_rpc_method_handler(
            self.should_rate_limit,
            request_deserializer=rls_pb2.RateLimitRequest.FromString,
            response_serializer=rls_pb2.RateLimitResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(SERVICE, {"ShouldRateLimit": method})

    async def aclose(self) -> None:
        """Close the store's connections."""
        closer = getattr(self.store, "aclose", None)
        if closer is not None:
            try:
                await closer()
            except Exception:  # closing a dead store must not fail the shutdown
                log.debug("closing the store failed", exc_info=True)

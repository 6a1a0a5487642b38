# A listening socket served by the listener (_listener.py), and its drain.
#
# Drain (the server is stopping): stop accepting; close the connections that wait
# for a request; let those with an answer in progress finish it (then close) for
# up to `timeout` seconds; WebSocket sessions are told to close (1001); whatever is
# left when the time is up is cut.
from __future__ import annotations

import asyncio
import socket
import ssl as _ssl
from typing import Any

from ._listener import Listener, ListenerSettings

__all__ = ["HTTPServer", "start_server"]


class HTTPServer:
    """A running listener: ``drain()`` stops it."""

    def __init__(self, server: asyncio.Server, settings: ListenerSettings) -> None:
        self.server = server
        self.settings = settings

    @property
    def state(self) -> Any:
        return self.settings.state

    async def drain(self, grace: float) -> None:
        """Stop accepting; answer what is in flight for up to ``grace`` seconds."""
        self.server.close()
        state = self.settings.state
        for session in list(state.sessions):
            session.shutdown()
        for proto in list(state.connections):
            proto.shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        # Polled: no one event marks "no connection and no session left" (a session
        # is the WebSocket module's, and tells nobody when it ends).
        while loop.time() < deadline and (  # noqa: ASYNC110
            state.connections or any(not t.is_closing() for t in state.sessions.values())
        ):
            await asyncio.sleep(0.05)
        for proto in list(state.connections):
            proto.transport.abort()
        for transport in state.sessions.values():
            if not transport.is_closing():
                transport.abort()
        state.sessions.clear()
        self.settings.outbox.flush()
        await asyncio.sleep(0)  # the aborted connections' connection_lost


async def start_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    ssl: _ssl.SSLContext | None = None,
    **settings: Any,
) -> HTTPServer:
    """Serve ``app`` (ASGI 3, with an optional callback path ``app.fast``) on
    ``sock`` or ``host:port``; ``settings`` are :class:`ListenerSettings`' keywords."""
    scheme = "https" if ssl is not None else "http"
    config = ListenerSettings(app, scheme=scheme, **settings)
    loop = asyncio.get_running_loop()

    def factory() -> Listener:
        return Listener(config)

    if sock is not None:
        server = await loop.create_server(factory, sock=sock, ssl=ssl, backlog=2048)
    else:
        server = await loop.create_server(
            factory, host=host, port=port, ssl=ssl, reuse_address=True, backlog=2048
        )
    return HTTPServer(server, config)

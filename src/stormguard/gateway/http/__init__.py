"""The gateway's own HTTP/1.1 layer.

* ``_head``: the request head's rules as pure functions (path normalisation, Host,
  status lines, header rendering);
* ``_listener``: the listener, an ``asyncio.Protocol`` over httptools' parser;
* ``_cycle``: one request on the ASGI path (receive, send, the answer's framing);
* ``_server``: a listening socket served by it, and its drain;
* ``_websocket``: the WebSocket session an upgrade is handed to.
"""

# Nothing is imported here: _wire.py imports _head, and _listener imports _wire.

"""``stormguard gateway``: an HTTP + WebSocket front door (private modules).

Run it with ``stormguard gateway --config FILE [--workers N]``; validate a file with
``stormguard gateway check FILE``. The pieces, each assembled from the server side,
protection, limiting and stores rather than rewritten:

* ``_config``: the pydantic models; every error as ``file:line:col: path: message``;
* ``_runtime``: a validated config as live objects (swapped whole on reload);
* ``_upstream``: per upstream its targets, connection pool, breaker, bulkhead, budget;
* ``chain`` / ``_ws``: the HTTP request chain and the WebSocket leg; ``_wire``: proxy headers;
* ``_metrics`` / ``_app``: Prometheus metrics, /status, the admin app;
* ``_tls``: the listener's and the upstreams' TLS contexts;
* ``http``: the HTTP/1.1 listener (the project's own, over httptools);
* ``_serve`` / ``_cli``: the listeners, signals, reload, workers, the command.

The gRPC leg lives in ``_grpc*.py`` beside these.
"""

"""``stormguard ratelimit-service``: Envoy's global rate-limit service (private modules).

Run it with ``stormguard ratelimit-service --config FILE [--config FILE ...]``;
validate files with ``stormguard ratelimit-service check FILE...``. It serves
``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` over gRPC from
envoyproxy/ratelimit's configuration files, deciding with the limiters and stores
the rest of stormguard uses. The pieces:

* ``protos/`` and ``_pb/``: Envoy's vendored ``.proto`` files and the messages
  generated from them (``make rls-protos``);
* ``_config``: the configuration format, matching, errors as ``file:line:col``;
* ``_decide``: one request in, one response out, every descriptor in one store call;
* ``_shadow``: limits that are decided and counted but never refuse;
* ``_stats`` / ``_admin``: Prometheus metrics, /status and the dashboard;
* ``_service`` / ``_serve`` / ``_workers`` / ``_cli``: options, the gRPC server,
  signals, reload, workers and the command.
"""

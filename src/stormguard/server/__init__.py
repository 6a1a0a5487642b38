"""The service's side: ASGI middlewares and gRPC server interceptors (private).

Public as :mod:`stormguard.asgi` and :mod:`stormguard.grpc`. The building blocks
here -- limit parsing, client keys, the per-request decision, refusal rendering,
the idempotency claim, admission and WebSocket limits -- are what the gateway
assembles; they live in the private modules of this package:

* ``_rules``: ``parse_limit``, ``Rule``, ``KeySpec`` / ``compile_key``, ``ClientAddress``;
* ``_decide``: ``RuleSet`` (all rules of a request in one store call);
* ``_refusal``: ``HeaderStyle``, ``limit_headers``, ``refusal``/``problem`` rendering,
  ``send_response``;
* ``_claims`` / ``_idempotency``: the claim stores and ``IdempotencyMiddleware``;
* ``_admission``: ``Admission`` (bulkhead per group and per client);
* ``_websocket``: ``WebSocketLimits`` and ``WebSocketGuard``.
"""

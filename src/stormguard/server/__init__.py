"""The service's side: ASGI middlewares and gRPC server interceptors (private).

Public as :mod:`stormguard.asgi`, :mod:`stormguard.fastapi` and :mod:`stormguard.grpc`.
The pieces below are what the gateway assembles (never copy them):

* ``_rules``: ``parse_limit("10/minute" | "N per M seconds" | algorithm)``, ``Rule``,
  ``compile_key(spec, ClientAddress.of(trusted_proxies)) -> (RequestView -> key|None)``
  for ``"ip"`` / ``"global"`` / ``"header:NAME"`` / callables, ``RequestView``;
* ``_view``: ``ScopeView(scope)``, the ASGI scope as a ``RequestView``;
* ``_decide``: ``RuleSet(rules, store=, on_store_error=, asyncio=)`` with
  ``await adecide(view, method, path)`` / ``decide(...)`` -- every matching rule in one
  store call, all or nothing -- and ``store_down`` / ``fails_closed``; ``open_store``;
* ``_refusal``: ``limit_headers(decision, "ietf"|"github"|"both")``, ``Refusal`` (status,
  headers, RFC 9457 body, reason), ``rate_limited`` (429), ``unavailable`` (503),
  ``send_refusal``, ``send_response``, ``send_websocket_refusal``;
  ``_ratelimit.refusal_for(decision, rules, style)`` picks 429 or 503;
  ``_ratelimit.RequestLimits(rules, headers=, headers_on_allowed=, **store options)``
  with ``await adecide(view)`` -> a ``Refusal`` or the headers for an admitted response
  (RateLimitMiddleware and the FastAPI dependency);
* ``_idempotency``: ``IdempotencyGuard`` -- ``admit(method, key)``, ``abegin(scope, key,
  fingerprint)`` -> ``Ticket`` | ``Refusal`` | replay ``(status, headers, body)``,
  ``afinish(ticket, status, encode_response(...))``, ``aabandon(ticket)`` (sync twins
  without the ``a``), each a driver over one of its steps (``claiming``, ``finishing``,
  ``abandoning``; ``once`` for a whole call); ``_claims``: the claim stores (memory,
  Redis Lua);
* ``_steps``: conversations as generators of ``Call(target, name, args)`` effects;
  ``drive(steps, run)`` performs them with the sync twins, ``await adrive(...)`` with
  the ``a<name>`` ones;
* ``_admission``: ``Admission(limit, per_client=, max_wait=)`` with ``aenter(client)`` ->
  ``Refusal | None`` and ``leave(client)``; ``AdmissionGroups`` by path prefix;
  ``_concurrency.run_cancelling_on_disconnect(app, scope, receive, send)``;
* ``_websocket``: ``WebSocketLimits`` and ``WebSocketGuard(limits, store=).run(app, scope,
  receive, send, client)``;
* ``_grpc``: the interceptors and ``peer_address``;
* ``_overload``: ``OverloadControl(limit | AdaptiveLimit, max_queue=, max_wait=,
  admission=)`` with ``aenter(priority, attempt, client)`` / ``enter(...)`` -> ``Ticket``
  | ``Refusal`` (503: ``shed:<class>``, ``concurrency_limit``, ``admission_control``)
  and ``leave(ticket, failed=, dropped=)``; ``status()``, ``metrics_text()`` -- the
  gateway's "priority and overload control" stage is a front end of it;
* ``_priority``: ``compile_priority(priority, routes=, address=, default=)`` ->
  ``(view, path) -> Priority``; ``core._attempts.attempt_from(view.header)`` reads the
  attempt number;
* ``_overload_asgi``: ``OverloadMiddleware``; ``_concurrency.run_admitted(control,
  ticket, app, scope, receive, send)`` runs an admitted request and reports its end.
"""

"""A small upstream for the gateway tests: ``python upstream.py PORT [NAME [CERT KEY]]``
(with CERT and KEY it serves https and wss).

Endpoints: ``/echo`` (method, path, raw path, headers and body size as JSON), ``/status/N``,
``/slow?s=SECONDS``, ``/hold?key=K`` (answers once ``/release?key=K`` was asked: a
request held as long as the test wants, without a sleep), ``/stream?n=N`` (N chunks),
``/big?n=BYTES``, ``/count`` (requests seen so far), ``/ws`` (echo; ``close:CODE``
closes with CODE).
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import WSMsgType, web

SEEN = {"n": 0, "in_flight": 0}
HOLDS: dict[str, asyncio.Event] = {}


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    SEEN["n"] += 1
    return web.json_response(
        {
            "name": request.app["name"],
            "method": request.method,
            "path": request.path_qs,
            "raw_path": request.raw_path,
            "headers": dict(request.headers),
            "size": len(body),
        }
    )


async def status(request: web.Request) -> web.Response:
    SEEN["n"] += 1
    return web.Response(status=int(request.match_info["code"]), text="status")


async def slow(request: web.Request) -> web.Response:
    SEEN["n"] += 1
    SEEN["in_flight"] += 1
    try:
        await asyncio.sleep(float(request.query.get("s", "1")))
    finally:
        SEEN["in_flight"] -= 1
    return web.Response(text="slow")


async def hold(request: web.Request) -> web.Response:
    SEEN["n"] += 1
    SEEN["in_flight"] += 1
    try:
        event = HOLDS.setdefault(request.query.get("key", ""), asyncio.Event())
        await asyncio.wait_for(event.wait(), 60)
    finally:
        SEEN["in_flight"] -= 1
    return web.Response(text="held")


async def release(request: web.Request) -> web.Response:
    HOLDS.setdefault(request.query.get("key", ""), asyncio.Event()).set()
    return web.Response(text="released")


async def stream(request: web.Request) -> web.StreamResponse:
    SEEN["n"] += 1
    response = web.StreamResponse()
    await response.prepare(request)
    for i in range(int(request.query.get("n", "3"))):
        await response.write(f"chunk{i}\n".encode())
        await asyncio.sleep(float(request.query.get("gap", "0")))
    await response.write_eof()
    return response


async def big(request: web.Request) -> web.Response:
    SEEN["n"] += 1
    return web.Response(body=b"x" * int(request.query.get("n", "100000")))


async def count(request: web.Request) -> web.Response:
    return web.json_response(SEEN)


async def ws(request: web.Request) -> web.WebSocketResponse:
    SEEN["n"] += 1
    socket = web.WebSocketResponse(max_msg_size=1 << 22)
    await socket.prepare(request)
    async for message in socket:
        if message.type == WSMsgType.TEXT:
            if message.data.startswith("close:"):
                await socket.close(code=int(message.data[6:]), message=b"bye")
                break
            await socket.send_str(message.data)
        elif message.type == WSMsgType.BINARY:
            await socket.send_bytes(message.data)
    return socket


def main() -> None:
    app = web.Application(client_max_size=1 << 24)
    app["name"] = sys.argv[2] if len(sys.argv) > 2 else "upstream"
    app.router.add_route("*", "/echo{tail:.*}", echo)
    app.router.add_route("*", "/v1/{tail:.*}", echo)
    app.router.add_route("*", "/status/{code}", status)
    app.router.add_route("*", "/slow", slow)
    app.router.add_route("*", "/hold", hold)
    app.router.add_get("/release", release)
    app.router.add_get("/stream", stream)
    app.router.add_get("/big", big)
    app.router.add_get("/count", count)
    app.router.add_get("/ws", ws)
    context = None
    if len(sys.argv) > 4:  # CERT KEY: serve https (and wss)
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[3], sys.argv[4])
    web.run_app(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        ssl_context=context,
        print=None,
        access_log=None,
        handler_cancellation=True,
    )


if __name__ == "__main__":
    main()

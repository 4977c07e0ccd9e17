"""The floors: the thinnest forwarders the same stack allows (uvicorn + uvloop + httptools serving a raw ASGI
app, one aiohttp ClientSession upstream). bench/proxy.py runs this beside coderouterd so each scenario's table
row says how much of the added latency is the stack itself on this machine, in the same run.

    python bench/floor.py UPSTREAM_URL PORT

Three floors in one process, chosen by path:

- `/v1/...`: forwards the body's bytes untouched and the answer's bytes untouched (the bare forwarder);
- `/parse/v1/...`: parses the body with orjson and re-serialises it before forwarding (the unavoidable work of
  any proxy that translates a request: the big-body floor);
- a streamed answer (`text/event-stream`) is forwarded chunk by chunk as the upstream's reads return (the
  streaming floor: its first byte reaches the client as soon as the upstream's does).

An `x-upstream` request header names another upstream (the benchmark's streaming fake).
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import orjson
import uvicorn
import uvloop

UPSTREAM = sys.argv[1]
PORT = int(sys.argv[2])
_session: aiohttp.ClientSession | None = None
_JSON = {"content-type": "application/json"}


async def app(scope, receive, send) -> None:
    global _session
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    chunks = []
    more = True
    while more:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        more = msg.get("more_body", False)
    body = b"".join(chunks)
    path = scope["path"]
    if path.startswith("/parse/"):
        path = path[len("/parse"):]
        body = orjson.dumps(orjson.loads(body))
    upstream = UPSTREAM
    for k, v in scope["headers"]:
        if k == b"x-upstream":
            upstream = v.decode()
    if _session is None:
        _session = aiohttp.ClientSession()
    async with _session.post(upstream + path, data=body, headers=_JSON) as r:
        ctype = r.headers.get("content-type", "application/json")
        if ctype.startswith("text/event-stream"):
            await send({"type": "http.response.start", "status": r.status,
                        "headers": [(b"content-type", ctype.encode())]})
            async for chunk in r.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        data = await r.read()
    await send({"type": "http.response.start", "status": r.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(uvicorn.Server(uvicorn.Config(app, port=PORT, loop="none", http="httptools", access_log=False,
                                              log_level="warning", proxy_headers=False)).serve())

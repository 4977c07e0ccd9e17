"""The floor: the thinnest forwarder the same stack allows (uvicorn + uvloop + httptools serving a raw ASGI
app, one aiohttp ClientSession upstream). bench/proxy.py runs it beside coderouterd so the table shows how
much of the added latency is the stack itself on this machine, in the same run.

    python bench/floor.py UPSTREAM_URL PORT
"""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import uvicorn
import uvloop

UPSTREAM = sys.argv[1]
PORT = int(sys.argv[2])
_session: aiohttp.ClientSession | None = None


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
    if _session is None:
        _session = aiohttp.ClientSession()
    async with _session.post(UPSTREAM + scope["path"], data=b"".join(chunks),
                             headers={"content-type": "application/json"}) as r:
        data = await r.read()
    await send({"type": "http.response.start", "status": r.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(uvicorn.Server(uvicorn.Config(app, port=PORT, loop="none", http="httptools", access_log=False,
                                              log_level="warning", proxy_headers=False)).serve())

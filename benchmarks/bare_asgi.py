"""The ceiling for one small request: a bare ASGI app on the same server as the broker.

It reads the whole request body and answers a fixed JSON body of the size of a produce answer,
served by uvicorn with the broker's protocol choices (httptools, uvloop, no access log, no
proxy headers, no ``server`` header) and the broker's collector threshold
(:func:`api.server.tune_gc`) on one process. ``python -m benchmarks.bare_asgi --port P``
serves it; :mod:`benchmarks.per_request` starts it in the same run as the broker and compares
the two under the same wrk load.
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn

# The size of a one-record produce answer (offsets of one partition), so the two servers write
# the same number of bytes.
ANSWER = b'{"offsets":[{"partition":0,"offset":123456,"error_code":null,"error":null}]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--http", default="httptools")
    parser.add_argument("--loop", default="uvloop")
    parser.add_argument(
        "--broker-protocol",
        action="store_true",
        help="serve with the broker's HTTP protocol (connection cap, head/body/send timeouts)",
    )
    args = parser.parse_args()
    http: Any = args.http
    if args.broker_protocol:
        from api.budgets import Budgets
        from api.connections import protocols
        from api.settings import Settings

        settings = Settings()
        budgets = Budgets.from_settings(settings)
        http, _ = protocols(
            budgets.gate,
            settings.header_timeout_ms,
            settings.body_timeout_ms,
            settings.send_timeout_ms,
        )
    from api.server import tune_gc

    tune_gc()
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        http=http,
        loop=args.loop,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,  # the broker sends none (api.server.uvicorn_config)
        backlog=2048,
    )


if __name__ == "__main__":
    main()

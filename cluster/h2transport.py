"""The h2c transport brokers replicate over: import everything from here.

Thin asyncio shells over the sans-I/O ``h2`` library, ignorant of replication:

* :class:`H2Server` (:mod:`cluster.h2server`) hands each request to a ``Handler``;
* :class:`H2Client` (:mod:`cluster.h2client`) multiplexes requests to one peer on one
  connection;
* :class:`H2Limits`, :class:`H2Request`, :class:`H2Response`, :class:`H2TransportError`
  (:mod:`cluster.h2base`) are shared; the flow-control and backpressure rules are described
  there;
* :mod:`cluster.h2frames` moves DATA payloads without copies (what ``h2`` is bypassed for,
  and what it still checks).

Errors: every network failure raises :class:`H2TransportError` (a ``ConnectionError``); a
request's own deadline raises ``TimeoutError``. Both are ``OSError``. A request the server did
not process (:class:`H2UnprocessedError`) is sent again by the client before it surfaces.
"""

from cluster.h2base import (
    H2Limits,
    H2Request,
    H2Response,
    H2TransportError,
    Handler,
)
from cluster.h2client import H2Client, H2UnprocessedError
from cluster.h2server import H2Server, H2ServerStats

__all__ = [
    "H2Client",
    "H2Limits",
    "H2Request",
    "H2Response",
    "H2Server",
    "H2ServerStats",
    "H2TransportError",
    "H2UnprocessedError",
    "Handler",
]

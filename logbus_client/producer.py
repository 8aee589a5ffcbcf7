"""An idempotent producer session over a :class:`~logbus_client.routing.Router`.

Kafka's idempotent producer, as Logbus serves it over HTTP (docs/api.md, "Idempotent
producers"): ``POST /v1/producers`` hands out a producer id and epoch (cluster-wide); every
produce to a partition then carries ``Logbus-Producer-Id``, ``Logbus-Producer-Epoch`` and
``Logbus-Sequence`` — the sequence of its first record, counted per partition. A repeat of one
of a partition's last 5 requests is answered with its original offsets and appends nothing, on
whichever broker leads the partition by then (the sequences travel in the replicated batches).
That is what lets the router resend a produce whose first attempt may have been written (a
timeout, a leader killed during the ``acks=all`` wait) without ever appending it twice.

Rules the caller keeps: at most one request in flight per partition (a second one could
overtake a retried first and be refused as out of order), and a request's body is resent
unchanged. A request is one batch, so it must fit the topic's ``max.message.bytes`` (1 MiB by
default). Sequences wrap at 2**31 as Kafka's do.

Credentials are the router's: a session on ``Router(urls, api_key=KEY)`` sends ``Authorization:
Bearer KEY`` with ``POST /v1/producers`` (a credential is all it needs, plus ``write`` on the
transactional id when it names one) and with every produce (``write`` on the topic).
"""

from __future__ import annotations

import threading
from urllib.parse import quote

import httpx

from .routing import Router

SEQUENCE_LIMIT = 2**31


class ProducerSession:
    """One producer id and epoch, and the next sequence of every partition it wrote to."""

    def __init__(self, router: Router, topic: str, transactional_id: str | None = None) -> None:
        self.router = router
        self.topic = topic
        self.transactional_id = transactional_id
        self.producer_id = -1
        self.producer_epoch = -1
        self._next: dict[int, int] = {}
        self._lock = threading.Lock()

    def init(self) -> httpx.Response:
        """``POST /v1/producers``; the answer, for the caller to check (201 on success)."""
        body = {} if self.transactional_id is None else {"transactional_id": self.transactional_id}
        r = self.router.request("POST", "/v1/producers", idempotent=False, json=body)
        if r.status_code == 201:
            doc = r.json()
            self.producer_id, self.producer_epoch = doc["producer_id"], doc["producer_epoch"]
        return r

    def send(
        self,
        partition: int,
        body: bytes,
        records: int,
        *,
        content_type: str = "application/x-ndjson",
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        """Produce ``records`` records (``body``) to ``partition`` at its leader, retried per
        :mod:`logbus_client.routing` as an idempotent request. The partition's sequence moves
        on only when the answer is a success."""
        if self.producer_id < 0:
            raise RuntimeError("ProducerSession.init() first")
        with self._lock:
            sequence = self._next.get(partition, 0)
        path = f"/v1/topics/{quote(self.topic, safe='')}/partitions/{partition}/records"
        r = self.router.request(
            "POST",
            path,
            partition=(self.topic, partition),
            idempotent=True,
            params=params,
            content=body,
            headers={
                "content-type": content_type,
                "logbus-producer-id": str(self.producer_id),
                "logbus-producer-epoch": str(self.producer_epoch),
                "logbus-sequence": str(sequence),
            },
        )
        if r.status_code < 300:
            with self._lock:
                self._next[partition] = (sequence + records) % SEQUENCE_LIMIT
        return r

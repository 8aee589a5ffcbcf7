"""A consume-transform-produce loop over HTTP, as a program a test can SIGKILL at any moment.

``python -m tests.jepsen.ctp_loop --url U [--url U2 ...] --in A --out B --group g --txn-id ctp
--mode session|single --log history.jsonl``

Theory of operation
-------------------
It reads every partition of topic A at ``isolation=read_committed`` from the group's committed
position, maps each record (offset o, integer value v) of partition p to one output record
(key ``"p/o"``, value ``v + OUTPUT_BASE``) in partition p of topic B, and writes a chunk of
outputs (up to ``--chunk`` records per input partition) together with the group's offsets (the
next input offset of each partition read) in ONE transaction. It exits 0 once the group's
position is at A's high watermark on every partition (the test fills A first).

Exactly once rests on one rule: the position the loop continues from is the group's committed
offset, read only when no transaction of the ``transactional_id`` can still commit. So

* at start, and after any refusal or unknown outcome, it first fences: a new session (``POST
  /v1/transactions/{id}``) aborts whatever an earlier incarnation left open and waits for a
  transaction being committed to complete; only then does it read ``GET
  /v1/groups/{g}/offsets`` (404: nothing committed, start at 0);
* ``--mode session``: begin (that fence), then per chunk produce to each output partition
  (sequence 0 in every transaction: the epoch is bumped at every commit), add the offsets,
  commit; a lost answer is retried with the same session and sequence (the partition
  deduplicates a produce, and a retried commit of the transaction that just ended answers its
  outcome); a definite refusal fences and re-reads.
* ``--mode single``: the one-request form ``POST /v1/transactions`` with records and offsets.
  200 commits; a definite error answer means it was aborted (resend from the same position); a
  lost answer (no answer, a 5xx) may have committed, so fence, re-read the offsets, and resend
  only if they did not move. Without the fence a request still in flight could commit after
  the re-read, and the resend would write its outputs a second time.

Retriable answers (409 CONCURRENT_TRANSACTIONS, 421, 503, connection errors) are retried after
a short backoff on another broker. Every call has a timeout (``CLIENT_TIMEOUT_S``).

For the test's checker (tests/jepsen/checker.py) it appends one JSON line per event to
``--log`` before and after each step (``write`` + flush: the kernel keeps it across SIGKILL):
``start`` (incarnation, mode), ``poll`` (records read from A), ``txn`` (before the commit is
sent: the outputs, offsets and session), ``end`` (its outcome: ok / fail / info, and the
produce offsets), ``unexpected`` (a 500 or a 5xx without a code: a bug, not an answer). A txn
line without an end line is a transaction whose process was killed before it knew the outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Callable
from typing import IO, Any, Final

import httpx

from tests.jepsen.answer import Answer

OUTPUT_BASE: Final = 10_000_000  # output value = input value + this (inputs are 1..10^7)
CLIENT_TIMEOUT_S: Final = 15.0  # > the brokers' request timeout, so acks=all is answered
BACKOFF_S: Final = 0.05
TXN: Final = "/v1/transactions"
TXN_TIMEOUT_MS: Final = 10_000  # a killed incarnation's transaction is aborted by the next begin


def transform(value: int) -> int:
    return value + OUTPUT_BASE


class Refused(Exception):
    """A definite refusal of a session call: fence and re-read."""


class Loop:
    def __init__(self, args: argparse.Namespace, log: IO[str]) -> None:
        self.urls: list[str] = args.url
        self.a: str = args.input
        self.b: str = args.output
        self.group: str = args.group
        self.txn_id: str = args.txn_id
        self.mode: str = args.mode
        self.chunk: int = args.chunk
        self.log = log
        self.rng = random.Random(args.seed)
        self.http = httpx.Client(timeout=CLIENT_TIMEOUT_S)
        self.session: tuple[int, int] = (-1, -1)
        self.positions: dict[int, int] = {}
        self.partitions = 0
        self.txns = 0
        self.reads = 0  # a new read session whenever the position may move back

    # -- plumbing --------------------------------------------------------------------------------

    def emit(self, kind: str, **fields: Any) -> None:
        self.log.write(
            json.dumps({"kind": kind, "pid": os.getpid(), "ns": time.monotonic_ns(), **fields})
            + "\n"
        )
        self.log.flush()

    def call(self, method: str, path: str, **kw: Any) -> Answer:
        url = self.rng.choice(self.urls) + path
        try:
            r = self.http.request(method, url, **kw)
        except httpx.HTTPError:
            return Answer(None)
        body: Any = None
        with contextlib.suppress(ValueError):
            body = r.json()
        a = Answer(r.status_code, body)
        if a.status is not None and (a.status == 500 or (a.status >= 500 and a.code is None)):
            self.emit("unexpected", what=f"{method} {path}", answer=repr(a))
        return a

    def until(
        self, what: str, attempt: Callable[[], Answer], ok: Callable[[Answer], bool]
    ) -> Answer:
        """Call until ``ok`` says the answer is final, backing off on retriable ones."""
        while True:
            a = attempt()
            if ok(a) or not a.retriable:
                return a
            time.sleep(BACKOFF_S)

    # -- the steps -------------------------------------------------------------------------------

    def fence_and_read(self) -> None:
        """A new session (aborting an earlier one's open transaction, waiting for a committing
        one), then the group's committed offsets: where to continue."""
        a = self.until(
            "begin",
            lambda: self.call(
                "POST", f"{TXN}/{self.txn_id}", json={"transaction_timeout_ms": TXN_TIMEOUT_MS}
            ),
            lambda a: a.status == 201,
        )
        if a.status != 201:
            raise SystemExit(f"begin refused: {a!r}")
        self.session = (int(a.body["producer_id"]), int(a.body["producer_epoch"]))
        a = self.until(
            "offsets",
            lambda: self.call("GET", f"/v1/groups/{self.group}/offsets"),
            lambda a: a.status in (200, 404),
        )
        committed = {}
        if a.status == 200:
            committed = {
                int(o["partition"]): int(o["offset"])
                for o in a.body["offsets"]
                if o["topic"] == self.a
            }
        elif a.status != 404:
            raise SystemExit(f"offsets: {a!r}")
        self.positions = {p: committed.get(p, 0) for p in range(self.partitions)}
        self.reads += 1
        self.emit("position", positions=self.positions, session=self.session)

    def describe(self) -> list[dict[str, Any]]:
        a = self.until(
            "describe",
            lambda: self.call("GET", f"/v1/topics/{self.a}/partitions"),
            lambda a: a.status == 200,
        )
        if a.status != 200:
            raise SystemExit(f"describe {self.a}: {a!r}")
        parts: list[dict[str, Any]] = a.body
        return parts

    def fetch(self, p: int) -> list[tuple[int, int]]:
        at = self.positions[p]
        invoke = time.monotonic_ns()
        a = self.until(
            "fetch",
            lambda: self.call(
                "GET",
                f"/v1/topics/{self.a}/partitions/{p}/records",
                params={"offset": at, "max_records": self.chunk, "isolation": "read_committed"},
            ),
            lambda a: a.status == 200,
        )
        if a.status != 200:
            raise SystemExit(f"fetch {self.a}-{p}: {a!r}")
        records = [(int(r["offset"]), int(r["value"])) for r in a.body["records"]]
        if records:
            self.emit(
                "poll",
                session=self.reads,
                partition=p,
                invoke_ns=invoke,
                complete_ns=time.monotonic_ns(),
                records=records,
            )
        return records

    def run(self) -> int:
        self.partitions = len(self.describe())
        self.emit("start", mode=self.mode, txn_id=self.txn_id)
        self.fence_and_read()
        while True:
            chunk = {p: self.fetch(p) for p in range(self.partitions)}
            chunk = {p: rs for p, rs in chunk.items() if rs}
            if not chunk:
                hws = {int(d["partition"]): int(d["high_watermark"]) for d in self.describe()}
                if all(self.positions[p] >= hws[p] for p in range(self.partitions)):
                    self.emit("done", positions=self.positions, txns=self.txns)
                    return 0
                continue
            nxt = {**self.positions, **{p: rs[-1][0] + 1 for p, rs in chunk.items()}}
            if self.mode == "session":
                self.session_txn(chunk, nxt)
            else:
                self.single_txn(chunk, nxt)

    def _txn_line(self, chunk: dict[int, list[tuple[int, int]]], nxt: dict[int, int]) -> int:
        self.txns += 1
        n = self.txns
        self.emit(
            "txn",
            n=n,
            invoke_ns=time.monotonic_ns(),
            session=self.session,
            writes=[[self.b, p, transform(v)] for p, rs in sorted(chunk.items()) for _, v in rs],
            offsets=[[self.a, p, nxt[p]] for p in sorted(chunk)],
        )
        return n

    def session_txn(self, chunk: dict[int, list[tuple[int, int]]], nxt: dict[int, int]) -> None:
        n = self._txn_line(chunk, nxt)
        pid, epoch = self.session
        offsets: list[int | None] = []
        try:
            for p, rs in sorted(chunk.items()):
                a = self.until(
                    "produce",
                    lambda p=p, rs=rs: self.call(  # type: ignore[misc]
                        "POST",
                        f"/v1/topics/{self.b}/partitions/{p}/records",
                        params={"acks": "all"},
                        json={
                            "records": [{"key": f"{p}/{o}", "value": transform(v)} for o, v in rs]
                        },
                        headers={
                            "Logbus-Transactional-Id": self.txn_id,
                            "Logbus-Producer-Id": str(pid),
                            "Logbus-Producer-Epoch": str(epoch),
                            "Logbus-Sequence": "0",
                        },
                    ),
                    lambda a: a.ok,
                )
                if not a.ok:
                    raise Refused(f"produce: {a!r}")
                offsets += [int(o["offset"]) for o in a.body["offsets"]]
            body = {
                "producer_id": pid,
                "producer_epoch": epoch,
                "group_id": self.group,
                "offsets": [
                    {"topic": self.a, "partition": p, "offset": nxt[p]} for p in sorted(chunk)
                ],
            }
            a = self.until(
                "add offsets",
                lambda: self.call("POST", f"{TXN}/{self.txn_id}/offsets", json=body),
                lambda a: a.ok,
            )
            if not a.ok:
                raise Refused(f"offsets: {a!r}")
        except Refused as e:
            self.emit("end", n=n, outcome="none", complete_ns=time.monotonic_ns(), why=str(e))
            self.fence_and_read()
            return
        invoke = time.monotonic_ns()
        self.emit("commit", n=n, invoke_ns=invoke)
        lost = False
        while True:
            a = self.call(
                "POST",
                f"{TXN}/{self.txn_id}/commit",
                json={"producer_id": pid, "producer_epoch": epoch},
            )
            if a.ok:
                self.emit(
                    "end",
                    n=n,
                    outcome="ok",
                    invoke_ns=invoke,
                    complete_ns=time.monotonic_ns(),
                    offsets=offsets,
                )
                self.session = (int(a.body["producer_id"]), int(a.body["producer_epoch"]))
                self.positions = nxt
                return
            lost = lost or a.lost
            if not a.retriable:
                # refused: aborted (a lost earlier attempt makes it unknown to this client)
                self.emit(
                    "end",
                    n=n,
                    outcome="info" if lost else "fail",
                    invoke_ns=invoke,
                    complete_ns=time.monotonic_ns(),
                    why=repr(a),
                )
                self.fence_and_read()
                return
            time.sleep(BACKOFF_S)

    def single_txn(self, chunk: dict[int, list[tuple[int, int]]], nxt: dict[int, int]) -> None:
        n = self._txn_line(chunk, nxt)
        body = {
            "transactional_id": self.txn_id,
            "transaction_timeout_ms": TXN_TIMEOUT_MS,
            "records": [
                {"topic": self.b, "partition": p, "key": f"{p}/{o}", "value": transform(v)}
                for p, rs in sorted(chunk.items())
                for o, v in rs
            ],
            "offsets": {
                "group_id": self.group,
                "offsets": [
                    {"topic": self.a, "partition": p, "offset": nxt[p]} for p in sorted(chunk)
                ],
            },
        }
        invoke = time.monotonic_ns()
        self.emit("commit", n=n, invoke_ns=invoke)
        a = self.call("POST", TXN, json=body)
        done = time.monotonic_ns()
        if a.ok:
            offsets = [int(o["offset"]) for o in a.body["offsets"]]
            self.emit("end", n=n, outcome="ok", invoke_ns=invoke, complete_ns=done, offsets=offsets)
            self.positions = nxt
            return
        if not a.lost:  # a definite answer: the transaction was aborted; resend from here
            self.emit("end", n=n, outcome="fail", invoke_ns=invoke, complete_ns=done, why=repr(a))
            if not a.retriable:
                raise SystemExit(f"one-request transaction refused: {a!r}")
            self.reads += 1  # the same chunk is read again
            time.sleep(BACKOFF_S)
            return
        self.emit("end", n=n, outcome="info", invoke_ns=invoke, complete_ns=done, why=repr(a))
        before = self.positions
        self.fence_and_read()  # continue from what committed: resend only if it did not
        if self.positions not in (before, nxt):
            self.emit(
                "unexpected",
                what="offsets after a lost answer",
                answer=f"{self.positions} not {before} or {nxt}",
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.jepsen.ctp_loop")
    parser.add_argument("--url", action="append", required=True, help="a broker (repeatable)")
    parser.add_argument("--in", dest="input", required=True)
    parser.add_argument("--out", dest="output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--txn-id", required=True)
    parser.add_argument("--mode", choices=("session", "single"), default="session")
    parser.add_argument("--chunk", type=int, default=20, help="records per input partition")
    parser.add_argument("--log", required=True, help="the JSON-lines event log (appended)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with open(args.log, "a", encoding="utf-8") as log:
        return Loop(args, log).run()


if __name__ == "__main__":
    sys.exit(main())

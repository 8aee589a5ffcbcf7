"""What each acks level answers on one broker, and what consumers see meanwhile (issue 10).

The fsync of an ``acks=all`` produce is held back (a gate in the injected file layer) while an
``acks=1`` produce lands behind it: the acks=1 answer comes at once, but no consumer sees
either record until the fsync covers the acks=all one; then the acks=all answer comes and both
are visible.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from tests.api.inprocess import app_client
from tests.core_log.faults import faulty_files


def test_acks1_produce_does_not_expose_an_acks_all_produce_before_its_fsync(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with app_client(tmp_path / "data") as (c, _state):
            assert (await c.post("/v1/topics", json={"name": "t"})).status_code == 201
            url = "/v1/topics/t/partitions/0/records"
            with faulty_files() as files:
                files.gate = gate = threading.Event()
                files.datasync_match = "t-0"
                durable = asyncio.create_task(
                    c.post(url, json={"records": [{"value": "all"}]}, params={"acks": "all"})
                )
                await asyncio.to_thread(files.wait_for_datasync)
                r = await c.post(url, json={"records": [{"value": "one"}]}, params={"acks": 1})
                assert r.status_code == 200 and r.json()["offsets"][0]["offset"] == 1
                r = await c.get(url, params={"offset": 0})
                assert r.json()["records"] == [] and r.json()["high_watermark"] == 0
                assert not durable.done()
                gate.set()
                r = await durable
            assert r.status_code == 200 and r.json()["offsets"][0]["offset"] == 0
            r = await c.get(url, params={"offset": 0})
            assert [x["value"] for x in r.json()["records"]] == ["all", "one"]

    asyncio.run(main())

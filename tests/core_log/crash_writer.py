"""Child process of ``test_crash_kill.py``: appends to a partition log until it is SIGKILLed.

Usage::

    python crash_writer.py DIR SEED EPOCH {clean|unclean}

It opens (and so recovers) the log in ``DIR`` — with ``clean_shutdown`` true only when the
parent closed the log cleanly — then appends batches forever with leader epoch ``EPOCH``. Every
record's key and value are a pure function of its offset (:func:`key_for`, :func:`value_for`),
so the parent can check any recovered record without knowing how the batches were cut.

Protocol on stdout, one line at a time, each flushed at once::

    READY <log_end_offset>                    the log is open (recovery finished)
    FLUSHED <recovery_point> <start> <crc>    flush() returned: every record below
                                              recovery_point is on disk; crc is the CRC-32 of
                                              the values of records [start, recovery_point),
                                              the ones this process appended

Every few flushes the process also writes ``log.checkpoint``, so the next recovery trusts the
segments below that recovery point and re-validates only the rest.
"""

from __future__ import annotations

import random
import sys
import zlib
from pathlib import Path

from core_log.batch import Record, build_batch
from core_log.clock import SystemClock
from core_log.compression import Compression
from core_log.config import LogConfig
from core_log.handles import HandleCache
from core_log.log import PartitionLog

# Small segments so a run rolls often; a small index interval so indexes have many entries.
CONFIG = LogConfig(segment_bytes=16 * 1024, index_interval_bytes=1024)
CODECS = (Compression.NONE, Compression.NONE, Compression.LZ4, Compression.ZSTD, Compression.GZIP)


def key_for(offset: int) -> bytes:
    return b"k%d" % (offset % 17)


def value_for(offset: int) -> bytes:
    """The value of the record at ``offset``: its offset, then a filler of offset-derived size."""
    filler = bytes((offset + i) % 251 for i in range((offset * 7919) % 97))
    return b"value-%012d|" % offset + filler


def build_request(
    rng: random.Random, first_offset: int, timestamp: int
) -> tuple[bytes, list[bytes]]:
    """One append request (one to three batches) whose records will get offsets from
    ``first_offset`` on; returns its bytes and the values in offset order."""
    parts: list[bytes] = []
    values: list[bytes] = []
    offset = first_offset
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        n = rng.randint(1, 8)
        records = [
            Record(value_for(o), key_for(o), timestamp=timestamp) for o in range(offset, offset + n)
        ]
        parts.append(build_batch(records, compression=rng.choice(CODECS)))
        values.extend(r.value for r in records if r.value is not None)
        offset += n
    return b"".join(parts), values


def main() -> None:
    directory, seed, epoch, mode = (
        Path(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
    )
    rng = random.Random(seed)
    clock = SystemClock()
    log = PartitionLog(directory, CONFIG, clock, HandleCache(16), clean_shutdown=mode == "clean")
    start = log.log_end_offset
    print(f"READY {start}", flush=True)
    crc = 0
    appends = flushes = 0
    flush_every = rng.randint(1, 5)
    while True:
        expected = log.log_end_offset
        data, values = build_request(rng, expected, clock.now_ms())
        result = log.append(data, leader_epoch=epoch)
        if result.base_offset != expected or result.records != len(values):
            print(f"ERROR append gave {result} at {expected}", file=sys.stderr, flush=True)
            sys.exit(3)
        for v in values:
            crc = zlib.crc32(v, crc)
        appends += 1
        if appends % flush_every == 0:
            recovery_point = log.flush()
            print(f"FLUSHED {recovery_point} {start} {crc}", flush=True)
            flushes += 1
            if flushes % 7 == 0:
                log.write_checkpoint()
            flush_every = rng.randint(1, 5)


if __name__ == "__main__":
    main()

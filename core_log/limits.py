"""Every cap of the storage engine, in one place, with its reason.

Anything that reads a length from the disk or the network checks it against one of these
before allocating, so a corrupt or hostile length can never make us allocate gigabytes.
"""

# A batch on disk or on the wire: Kafka's default message.max.bytes is ~1 MiB; we allow topics
# to raise it, but never past this, so a length field read from a torn file is bounded.
MAX_BATCH_BYTES = 64 * 1024 * 1024
# The smallest max.message.bytes a topic may have: a batch header (61 bytes) and one record with
# a small key and value. Kafka allows 0, which makes every produce to the topic fail.
MIN_MESSAGE_BYTES = 128

# Records in one batch: bounds the work of decoding one batch (Kafka has no explicit cap;
# 1 MiB of 1-byte records is ~140k records).
MAX_RECORDS_PER_BATCH = 1_000_000

# Decompressed size of one batch a reader accepts from the log: guards against compression
# bombs (zstd reaches 32,000:1 on repetitive data). Stays above the produce cap below so data
# written before that cap existed still reads.
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024

# Decompressed records of one batch a producer sends, as a multiple of the topic's
# max.message.bytes (which, as in Kafka, bounds the batch as sent, i.e. compressed). Kafka has
# no such cap, so an 8 KB zstd batch could carry a 250 MiB record that every fetch then
# inflates and renders (measured: a 333 MB JSON answer for one record; two took the broker to
# 2.5 GB RSS and stalled it 17.5 s). Producers stay far below 16x: a Kafka producer fills
# batch.size (16 KiB) before compressing, and JSON logs compress 5-10x with zstd. With the
# default max.message.bytes (1 MiB) a batch may carry 16 MiB of records; larger records need a
# larger max.message.bytes, as they would uncompressed.
MAX_DECOMPRESSED_BATCH_RATIO = 16

# ... and never more than this, whatever the topic allows: every record produce accepts fits
# in one fetch of MAX_FETCH_BYTES.
MAX_PRODUCED_DECOMPRESSED_BYTES = 64 * 1024 * 1024

# Headers per record and header key length (Kafka: unbounded; we pick generous fixed caps).
MAX_HEADERS_PER_RECORD = 1024
MAX_HEADER_KEY_BYTES = 64 * 1024

# Record timestamps (ms since the epoch) every reader can render: -1 (none) or 0 up to
# 9999-12-31T23:59:59.999Z. Java's Instant and Python's datetime stop at year 9999 (datetime)
# or far beyond (Instant), and Arrow's int64 microseconds overflow near 2^63 / 1000 ms, so a
# timestamp near 2^63 is accepted by no reader; produce rejects it (INVALID_TIMESTAMP).
MAX_TIMESTAMP_MS = 253_402_300_799_999
NO_TIMESTAMP = -1

# A single fetch never returns more than this, whatever max_bytes a caller asks for.
MAX_FETCH_BYTES = 64 * 1024 * 1024

# Segment size ceiling: relative positions in the offset index are 32-bit.
MAX_SEGMENT_BYTES = 2**31 - 1

# Relative offsets in the indexes are 32-bit.
MAX_RELATIVE_OFFSET = 2**31 - 1

# Segments deleted per retention pass per partition: bounds the cost of one pass so the
# retention task never starves appends (a backlog is worked off over several passes).
MAX_SEGMENTS_DELETED_PER_PASS = 64

# Open segment file handles across the whole broker (active segments are always open).
DEFAULT_MAX_OPEN_SEGMENT_HANDLES = 1024

# Reads and writes at least this large run in a worker thread instead of the event loop.
# Appends holding a compressed batch always do: their cost is set by the decompressed size,
# which the compressed size does not bound (512 bytes of zstd RLE blocks expand to 16 MiB).
OFF_LOOP_IO_BYTES = 256 * 1024

# Pending waiters on one partition (long-polls); beyond it callers get an immediate answer.
MAX_WAITERS_PER_PARTITION = 100_000

# Partitions of one topic (Kafka has no fixed cap): creating 10,000 empty partitions takes
# ~5 s on a loaded 2-vCPU machine (benchmarks/admin.py), within a client's usual timeout.
MAX_PARTITIONS_PER_TOPIC = 10_000

# Partitions on one broker, internal topics included (KIP-578's max.broker.partitions). An empty
# partition costs ~4.6 KiB of memory (70 MiB at the cap); what binds is that each opened one
# pins the descriptor of its active segment, so the default stays below a 20,000-descriptor
# RLIMIT_NOFILE with room for connections.
DEFAULT_MAX_BROKER_PARTITIONS = 15_000

# Partition logs created per worker-thread hop when a topic is created or grown: the event loop
# runs between hops, so a 10,000-partition creation never holds it for more than one hop.
CREATE_CHUNK_PARTITIONS = 500

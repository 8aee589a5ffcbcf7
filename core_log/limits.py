"""Every cap of the storage engine, in one place, with its reason.

Anything that reads a length from the disk or the network checks it against one of these
before allocating, so a corrupt or hostile length can never make us allocate gigabytes.
"""

# A batch on disk or on the wire: Kafka's default message.max.bytes is ~1 MiB; we allow topics
# to raise it, but never past this, so a length field read from a torn file is bounded.
MAX_BATCH_BYTES = 64 * 1024 * 1024

# Records in one batch: bounds the work of decoding one batch (Kafka has no explicit cap;
# 1 MiB of 1-byte records is ~140k records).
MAX_RECORDS_PER_BATCH = 1_000_000

# Decompressed size of one batch: guards against compression bombs (zstd can reach 1000:1).
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024

# Headers per record and header key length (Kafka: unbounded; we pick generous fixed caps).
MAX_HEADERS_PER_RECORD = 1024
MAX_HEADER_KEY_BYTES = 64 * 1024

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

"""Every cap and default of the Spark connector, in one place, with its reason."""

from __future__ import annotations

# One fetch asks for this many bytes of batches (option ``fetchMaxBytes``). 2 MiB is ~25k
# records of 80 bytes: a request's fixed cost (~0.3 ms over loopback) is noise, and the Arrow
# batch it becomes is small enough that Spark consumes one while the next is fetched (on the
# Spark benchmark 2 MiB beat 1, 8 and 32 MiB by 10-25%).
FETCH_MAX_BYTES = 2 * 1024 * 1024
# The broker never answers with more than 64 MiB; a single batch larger than the current ask
# makes the reader double its ask up to this.
FETCH_MAX_BYTES_CEILING = 64 * 1024 * 1024

# HTTP timeouts (seconds): connecting to a broker that is up takes milliseconds; a fetch of
# 8 MiB or a produce fsync takes well under a second, so a minute means the broker is stuck.
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 60.0

# Attempts of a request that failed with a transport error, a retriable status (5xx, 429) or a
# 421 from a broker that does not lead (see logbus_client.routing). Reads are idempotent,
# produces carry an Idempotency-Key or a transactional sequence, so a retry never duplicates.
# 100 ms doubling to 1 s over 16 attempts is 13.5 s of backoff: more than a leader failover
# takes with the default broker.session.timeout.ms of 9 s, so a query rides out a leader kill
# without failing a task.
MAX_ATTEMPTS = 16
RETRY_BACKOFF_S = 0.1
RETRY_BACKOFF_MAX_S = 1.0

# One produce request from the sink: the broker builds one batch per partition from it for an
# idempotent request, and a batch must fit the topic's max.message.bytes (1 MiB by default),
# so a request carries at most 512 KiB of keys, values and headers and 5,000 records.
PRODUCE_MAX_BYTES = 512 * 1024
PRODUCE_MAX_RECORDS = 5_000

# A transactional sink task buffers each partition's next request; across all partitions it
# holds at most this many payload bytes (the largest buffer is sent when it is reached), so a
# task writing to hundreds of partitions does not hold hundreds of 512 KiB requests.
SINK_BUFFER_MAX_BYTES = 16 * 1024 * 1024

# Kafka's transaction.timeout.ms for the sink is the broker's transaction.max.timeout.ms
# (15 min): a micro-batch's transactions stay open from the tasks' first writes until the
# driver commits the batch, which waits for the slowest task.
TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000

# Partitions one query may follow: each costs a little work per trigger on the driver.
MAX_TOPIC_PARTITIONS = 100_000

"""Client-side pieces shared by Logbus's own clients (the CLI, the benchmarks, the Spark
connector). Depends on httpx only — never on the broker's packages — so the Spark connector can
use it on executors that have nothing else of Logbus installed."""

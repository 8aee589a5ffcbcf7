# Two commands for a newcomer: `make run` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# One stamp per set of extras: `make run` installs the broker's runtime dependencies only
# (no test tools, no Spark); `make test` adds the test tools and Spark.
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
SPARK_STAMP := $(VENV)/.installed-spark
DATA_DIR ?= ./logbus-data
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: run cluster test test-slow lint typecheck browser postgres redis bench bench-storage bench-cluster bench-auth bench-txn clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,spark]'
	touch $(TEST_STAMP) $(RUN_STAMP) $(SPARK_STAMP)

$(SPARK_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[spark]'
	touch $(SPARK_STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/logbus serve --data-dir $(DATA_DIR) --host $(HOST) --port $(PORT)

# Three brokers on PORT, PORT+1, PORT+2 sharing one SQLite metadata store; Ctrl-C stops them.
# Their data lives in ./logbus-cluster (not DATA_DIR's default: a single broker's data dir
# and a cluster's do not mix); `make cluster DATA_DIR=...` chooses another.
cluster: DATA_DIR = ./logbus-cluster
cluster: $(RUN_STAMP)
	$(BIN)/logbus cluster up --brokers 3 --data-dir $(DATA_DIR) --host $(HOST) --base-port $(PORT)

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

test: $(TEST_STAMP) lint typecheck browser postgres redis
	$(BIN)/pytest -m "not slow" -q --durations=30

# The browser test (EventSource and WebSocket in headless Chromium) needs Debian's chromium;
# without root or apt it skips and says why.
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium could not be installed: tests/api/test_browser.py will skip"

# The cluster tests start a throwaway PostgreSQL server (tests/pg.py) from Debian's package
# binaries in /usr/lib/postgresql/<version>/bin, which are not on PATH.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
		|| (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) \
		|| echo "postgresql could not be installed: the PostgreSQL tests will skip"

# benchmarks.redis_peer's test starts Debian's redis-server; without root or apt it skips.
redis:
	@command -v redis-server >/dev/null 2>&1 \
		|| (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null) \
		|| echo "redis-server could not be installed: the Redis benchmark test will skip"

test-slow: $(TEST_STAMP) postgres
	$(BIN)/pytest -m slow -q

# The single broker against the machine's limits, then issue 14's per-request ratios (each
# measured side by side in one run: a bare ASGI app, Redis Streams, a 3-broker cluster);
# docs/benchmarks.md, "HTTP service" and "Per-request cost"; ≈ 12 min on a quiet machine.
bench: $(TEST_STAMP)
	$(BIN)/pip install -q -e '.[test,bench]'
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server)
	$(BIN)/logbus bench --json docs/bench-http.json --plot docs/bench-http.png
	$(BIN)/python -m benchmarks.per_request --json docs/bench-per-request.json --plot docs/bench-per-request.png

bench-storage: $(RUN_STAMP)
	$(BIN)/python -m benchmarks.storage

# 3 brokers on this host (shared SQLite store) vs one: RF=3 acks=all produce as a ratio to RF=1,
# replication lag, leader failover over 20 SIGKILLs (3 more with the default timings);
# docs/benchmarks.md, "Cluster"; ≈ 8 min on a quiet machine.
bench-cluster: $(RUN_STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python -m benchmarks.cluster --default-kills 3 --json docs/bench-cluster.json --plot docs/bench-cluster.png

# Produce throughput with authentication and 100 ACLs, and with a quota on top, as ratios to a
# broker without authentication (three brokers side by side, alternating rounds);
# docs/benchmarks.md, "Authentication, ACLs and quotas"; ≈ 4 min.
bench-auth: $(RUN_STAMP)
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python -m benchmarks.auth --rounds 12 --seconds 2 --json docs/bench-auth.json

# Transactional produce (commit every 100 ms) vs plain, read_committed vs read_uncommitted
# fetch, one broker, alternating rounds; docs/benchmarks.md, "Transactions"; ≈ 1 min.
bench-txn: $(RUN_STAMP)
	$(BIN)/python -m benchmarks.transactions --json docs/bench-transactions.json

bench-spark: $(SPARK_STAMP)
	$(BIN)/python -m benchmarks.spark --json docs/bench-spark.json

# HTTP/2 replication transport: h2c vs HTTP/1.1 on one connection (cluster/h2frames.py).
bench-h2: $(RUN_STAMP)
	$(BIN)/python -m benchmarks.h2_fetch --json docs/bench-h2.json

# The click-stream example against a running broker (make run): produce, then count.
example-spark: $(SPARK_STAMP)
	$(BIN)/python -m examples.clickstream.produce_clicks --url http://$(HOST):$(PORT)
	$(BIN)/python -m examples.clickstream.pipeline --url http://$(HOST):$(PORT) --available-now

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache

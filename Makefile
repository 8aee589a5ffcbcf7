# Two commands for a newcomer: `make run` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATA_DIR ?= ./logbus-data
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: run test test-slow lint typecheck browser bench bench-storage clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/logbus serve --data-dir $(DATA_DIR) --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) lint typecheck browser
	$(BIN)/pytest -m "not slow" -q

# The browser test (EventSource and WebSocket in headless Chromium) needs Debian's chromium;
# without root or apt it skips and says why.
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) \
		|| echo "chromium could not be installed: tests/api/test_browser.py will skip"

test-slow: $(STAMP)
	$(BIN)/pytest -m slow -q

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[test,bench]'
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/logbus bench --json docs/bench-http.json --plot docs/bench-http.png

bench-storage: $(STAMP)
	$(BIN)/python -m benchmarks.storage

bench-spark: $(STAMP)
	$(BIN)/python -m benchmarks.spark --json docs/bench-spark.json

# The click-stream example against a running broker (make run): produce, then count.
example-spark: $(STAMP)
	$(BIN)/python -m examples.clickstream.produce_clicks --url http://$(HOST):$(PORT)
	$(BIN)/python -m examples.clickstream.pipeline --url http://$(HOST):$(PORT) --available-now

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache

# The README's commands are these targets.  Everything installs into .venv (pinned by requirements.lock)
# and .tools/ (helm), so a fresh machine needs only python3, java and make.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))

.PHONY: setup tools chromium virtuoso test test-fast run bench docs clean

setup: $(STAMP)

$(STAMP): requirements.lock requirements-dev.lock pyproject.toml
	@echo "==> creating $(VENV) and installing pinned dependencies (PySpark builds from source the first time: ~2 min)"
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --progress-bar off --upgrade pip==26.3
	$(VENV)/bin/pip install --progress-bar off --require-hashes -r requirements.lock -r requirements-dev.lock
	$(VENV)/bin/pip install --progress-bar off --no-deps -e .
	touch $(STAMP)

tools: setup
	@bash .ci/install-tools.sh

## Debian's chromium, for the gateway's console test (headless, through playwright).
chromium:
	@bash .ci/install-chromium.sh

## Debian's Virtuoso, the SPARQL endpoint the background-data (SERVICE) tests and bench start on a free port.
virtuoso:
	@bash .ci/install-virtuoso.sh

## Run the whole product locally: embedded broker, services, demo data, example queries, live answers.
run: setup
	$(PY) -m services.commands.run

## Everything CI checks: unit, property, end-to-end (embedded broker), Spark, Helm/Docker validation.
## The in-memory tests run on both cores (a file per worker); those that start real processes (`slow`: broker,
## Spark, services with timeouts) after them, two files at a time: they wait on their processes more than they
## compute, each worker has its own broker and Spark session, and every port is a free one.
test: setup tools chromium virtuoso
	$(PY) -m pytest -q -m "not slow" -n 2 --dist loadfile
	$(PY) -m pytest -q -m slow -n 2 --dist loadfile

## Only the engine tests (no broker, no Spark): a fast inner loop.
test-fast: setup
	$(PY) -m pytest -q -m "not slow" -n 2 --dist loadfile

## The documentation: every relative link and anchor resolves, the README stays short (tests/docs).
docs: setup
	$(PY) -m pytest -q tests/docs

## The engine against pyoxigraph re-evaluation and pathway (installed into its own venv by bench/setup.sh).
bench: setup
	bash bench/setup.sh
	$(PY) bench/engine_bench.py

clean:
	rm -rf $(VENV) .tools .pytest_cache .hypothesis .run

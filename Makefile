# Two commands matter: `make run` and `make test`. Each sets up everything it
# needs (virtualenv, Kafka, MariaDB, schema, topics) and is safe to repeat.
# While editing, `make unit` is the fast loop: no services, no installs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python

.PHONY: run test unit lint docs checks have-venv chaos test-tools setup venv services services-down services-status migrate topics bench release clean

run: setup ## set up everything, then run one worker, the fake services and a demo producer
	ops/run-demo.sh

# The suite runs in TEST_PROCESSES processes at once (pytest-xdist), a test module's tests in one of them:
# every test has its own database, topics, consumer group and ports, and most of a test's time is spent
# waiting for workers, Kafka and MariaDB. TEST_PROCESSES=1 runs it in one process, as before.
TEST_PROCESSES ?= 3
test: venv services topics test-tools lint docs ## set up everything, then run the whole test suite (the tests migrate scratch databases of their own, never the demo's; TEST_PROCESSES=n: n processes at once, 3 by default)
	$(BIN)/pytest $(if $(filter-out 1,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadfile) $(PYTEST_ARGS)

lint: venv checks ## ruff (the rules in pyproject.toml) and mypy on the pure core ([tool.mypy] there)

# The unit tests and `make lint`'s checks on the virtualenv as it is: it needs no services and installs
# nothing (a missing virtualenv is made once by `make venv`, or by `make test` or `make run`).
unit: have-venv checks ## the fast loop while editing (well under a minute): the linters, then tests/unit
	$(BIN)/pytest tests/unit -q $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/): built strictly, so a broken link or anchor fails;
# `.venv/bin/mkdocs serve` serves it while editing. SITE_DIR keeps the build somewhere of your own.
docs: venv ## build the documentation site strictly (a broken link or anchor fails) into a temporary folder, or SITE_DIR
	@site=$${SITE_DIR:-$$(mktemp -d)}; NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -f mkdocs.yml -d "$$site" && \
	  echo "the documentation site is in $$site (index.html)"

checks: have-venv
	$(BIN)/ruff check .
	$(BIN)/mypy

have-venv:
	@for tool in pytest ruff mypy; do [ -x $(BIN)/$$tool ] || { \
	  echo "no $(BIN)/$$tool: run \`make venv\` once (it makes the virtualenv and installs the packages)" >&2; \
	  exit 1; }; done
	@[ ! $(VENV)/.installed -ot pyproject.toml ] || \
	  echo "note: pyproject.toml changed since the virtualenv was made; \`make venv\` brings it up to date" >&2

chaos: setup test-tools ## the long chaos run (minutes): its own Kafka and MariaDB, 3 workers, the storm, the drain, the check; SEED=n repeats a run; MODE=defaults: every worker setting at its default, 5,000 orders, and how long each SMS waited; MODE=pace: the long run with every API at a real provider's pace (a lognormal tail, 1 % hangs, the waybill API's 429s above 150 calls/s); CLUSTER=1 on three Kafka nodes over SASL_SSL (CUT_FORGETS=1: the connections the broker cut hung stay hung); DB_FAILOVER=semisync|async: MariaDB as a primary and its GTID replica, failed over mid-storm, what it lost counted; MODE=outbox: an order service's outbox relayed by Debezium in Kafka Connect (ORDERS=2000 orders, Connect SIGKILLed every 400), both with and without Connect's exactly-once support; OUTBOX=at-least-once|exactly-once: the long run's storm with its records written by an order service into its outbox and relayed by Debezium (Connect SIGKILLed 5 times), the workers reading EVENT_ENVELOPE=outbox; MODE=upgrade: a rolling upgrade under the storm, from the previous release (ops/releases.toml) to this code and back, the migration online, each replacement's replay window and rebalance seconds
	$(if $(filter outbox,$(MODE)),OUTBOX_ORDERS=$(or $(ORDERS),2000) $(PY) -m pytest -s -p no:cacheprovider tests/integration/test_outbox_upstream.py,$(PY) -m harness.chaos.driver --mode $(or $(MODE),long) $(if $(SEED),--seed $(SEED)) $(if $(CLUSTER),--cluster) $(if $(CUT_FORGETS),--cut-forgets) $(if $(DB_FAILOVER),--db-failover $(DB_FAILOVER)) $(if $(OUTBOX),--outbox $(OUTBOX)))

setup: venv services migrate topics

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,bench]'
	touch $@

test-tools: ## from Debian: docker-compose (v1, validates docker-compose.yml), kcat, chromium (the console's browser test), prometheus (promtool: checks and unit-tests the alert rules; the server runs the dashboard's and rules' queries), prometheus-alertmanager (amtool: checks the Alertmanager config and its routes); Kafka's Java client; Jaeger's all-in-one program, built once from its Go module (the tracing test); Helm and the chart's manifest checker (deploy/helm/checker), built once from their Go modules (the chart's tests); the previous release, built once from its commit (ops/releases.toml) with a virtualenv of its own (the rolling-upgrade and schema-rule tests)
	ops/services.sh jars
	ops/services.sh jaeger
	ops/services.sh helm
	ops/services.sh k8s-checker >/dev/null
	$(PY) -m harness.releases
	@missing=""; command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	  command -v kcat >/dev/null || missing="$$missing kcat"; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  command -v promtool >/dev/null || missing="$$missing prometheus"; \
	  command -v amtool >/dev/null || missing="$$missing prometheus-alertmanager"; \
	  if [ -n "$$missing" ]; then echo "installing$$missing from Debian"; \
	    sudo=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	    $$sudo apt-get update -qq >/dev/null && \
	    $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi

services: ## start Kafka and MariaDB unless they already answer (KAFKA_NODES=3: three nodes; KAFKA_SECURE=1: SASL_SSL and mTLS listeners too)
	ops/services.sh up

services-down: ## stop what `make services` started
	ops/services.sh down

services-status:
	ops/services.sh status

migrate: venv services ## python -m app.admin migrate: the database of MYSQL_URL to this code's schema
	@$(PY) -m app.admin migrate || { echo "make migrate: the database of MYSQL_URL could not be migrated. If it says it can't locate a revision, a newer checkout of this project migrated that database: run that checkout, or drop the database if it holds only demo data (it is created again by make setup)." >&2; exit 1; }

topics: venv services ## create order-event and order-event-dlq (at TOPIC_REPLICATION; with KAFKA_NODES=3 it defaults to 3)
	TOPIC_REPLICATION=$${TOPIC_REPLICATION:-$${KAFKA_NODES:-1}} $(PY) -m app.admin create-topics

bench: setup ## the throughput benchmark, then the rows at a provider's pace (minutes; see docs/benchmarks.md)
	$(PY) -m bench.run
	$(PY) -m bench.provider_pace

release: venv ## VERSION=X.Y.Z: build the sdist and the wheel into dist/, check the wheel, tag vX.Y.Z, record it in ops/releases.toml (docs/upgrading.md)
	PY=$(PY) ops/release.sh $(VERSION)

clean: services-down
	rm -rf $(VENV) .cache

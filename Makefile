# stormguard — the two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test test-all stress lint types unit demo bench docs clean rls-protos test-floors

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(VENV)/.bench-installed: pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	touch $(VENV)/.bench-installed

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

types: $(STAMP)
	$(BIN)/mypy src tests/typing

# pytest-xdist workers: three on a two-core machine keeps both cores busy while the
# gateway tests wait on the processes they start (more makes the timing tests flaky);
# the heavy stress tests wait for `make test-all`.
JOBS ?= 3
unit: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) --dist load -m "not stress and not driver2"

# The heavy stress tests, and the gateway tests again on the chain's second driver
# (the wire conformance suite runs on both in `make test`).
stress: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) --dist load -m "stress or driver2"

# Everything: what `make test` runs, then the stress tests (CI runs both).
test-all: test stress

test: lint types unit

demo: $(STAMP)
	$(BIN)/stormguard demo
	$(BIN)/stormguard demo gateway
	$(BIN)/stormguard demo overload

bench: $(VENV)/.bench-installed
	$(BIN)/python -m bench

$(VENV)/.docs-installed: pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(VENV)/.docs-installed

# The documentation site (mkdocs.yml, docs/) into site/: strict, so a broken link,
# a missing page or an unresolved API name fails the build. Nothing is fetched.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The rate-limit service's protobuf modules (src/stormguard/gateway/rls/_pb) from the
# vendored .proto files. grpcio-tools is pinned: its generated code's runtime check is
# the floor of `protobuf` in pyproject.toml (1.70.0 -> protobuf 5.29.0).
PROTOS_VENV := .venv-protos
GRPC_TOOLS  := grpcio-tools==1.70.0

rls-protos:
	$(PYTHON) -m venv $(PROTOS_VENV)
	$(PROTOS_VENV)/bin/python -m pip install --quiet '$(GRPC_TOOLS)'
	$(PROTOS_VENV)/bin/python tools/gen_rls_protos.py

# The gateway tests (and tests/rls: the rate-limit service, uvicorn's only user) once more
# at the lowest versions pyproject.toml allows
# (constraints/floors.txt pins every floor), in a venv of their own, so a lower
# bound is a version the tests pass on. `make test` covers the newest ones.
FLOORS_VENV := .venv-floors
FLOORS_BIN  := $(FLOORS_VENV)/bin
FLOORS      := constraints/floors.txt

$(FLOORS_VENV)/.installed: pyproject.toml $(FLOORS)
	rm -rf $(FLOORS_VENV)
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_BIN)/python -m pip install --quiet --upgrade pip
	$(FLOORS_BIN)/python -m pip install --quiet -c $(FLOORS) -e '.[test]'
	$(FLOORS_BIN)/python tools/check_floors.py $(FLOORS)
	touch $@

# The stress tests (load and timing, not versions) run once, in `make stress`: run
# again here beside the other heavy multi-process tests, the slowed-Redis one saw
# the store's timeout fire on a saturated machine.
test-floors: $(FLOORS_VENV)/.installed
	$(FLOORS_BIN)/python -m pytest -n $(JOBS) --dist load -m "not stress" tests/gateway tests/rls -q

clean:
	rm -rf $(VENV) $(PROTOS_VENV) $(FLOORS_VENV) .mypy_cache .pytest_cache .ruff_cache site

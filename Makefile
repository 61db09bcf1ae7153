# Two entry points, both from a fresh clone with only Python 3.11 and pip:
#   make demo   set up .venv and run an agent loop offline, printing its timing
#               (SWIFTCLIENT_DEMO_PROVIDER=openai or a URL: a provider instead)
#   make test   set up .venv and run every test, lint and type check
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: demo test lint typecheck setup clean

# Everything: the package, its dev tools and the test peers (make test).
$(STAMP): pyproject.toml scripts/setup
	PY=$(PY) bash scripts/setup
	touch $(STAMP) $(RUN_STAMP)

# What the demo runs on: the package with the local engine (no dev tools, no test peers).
$(RUN_STAMP): pyproject.toml scripts/setup
	PY=$(PY) bash scripts/setup run
	touch $(RUN_STAMP)

setup: $(STAMP)

demo: $(RUN_STAMP)
	$(BIN)/python examples/stream_chat.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers, each taking whole files (module fixtures such as a served engine start once):
# the suite waits on sockets and subprocesses as much as it computes, so on a 2-core machine
# two workers took 577 s where one took 958 s.
test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -n 2 --dist loadfile

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache

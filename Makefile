# Scrinalia runner: the two commands a newcomer needs.
#   make dev   everything (embedded PostgreSQL, API + panel, a runner)
#   make test  the whole test suite against a real PostgreSQL
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
STAMP   = $(VENV)/.installed

.PHONY: dev test install bench clean browser

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints-cpu.txt torch==2.13.0
	$(PIP) install -q -c constraints-cpu.txt -e '.[api,runner,dev]'
	touch $(STAMP)

install: $(STAMP)

browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "chromium could not be installed: browser tests will fail"

test: install browser
	$(PY) -m pytest $(PYTEST_ARGS)

dev: install
	$(VENV)/bin/scrinalia dev

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .scrinalia .pytest_cache

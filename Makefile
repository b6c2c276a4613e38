# Scrinalia runner: the two commands a newcomer needs.
#   make dev   everything (embedded PostgreSQL, API + panel, a runner)
#   make test  the linter and the type checker, then the whole test suite against a real PostgreSQL
#   make dist  the wheel and the sdist to install from (docs/install.md)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
STAMP   = $(VENV)/.installed

.PHONY: dev test lint install bench clean system-deps dist rules

# What `make lint` checks: every Python tree of the repository (configuration in pyproject.toml).
LINT_PATHS = scrinalia runner migrations bench tests

$(STAMP): pyproject.toml constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints-cpu.txt torch==2.13.0
	$(PIP) install -q -c constraints-cpu.txt -e '.[api,runner,dev]'
	touch $(STAMP)

install: $(STAMP)

# Debian packages the tests drive: PostgreSQL's server binaries (the throwaway test cluster), chromium
# (the panel's browser tests), libfaketime (the wrong-clock test) and nftables (the runner's partition
# tests drop packets on the test cluster's port), systemd-container (systemd-nspawn: tests/systemd boots a
# container with systemd as PID 1 on a root of its own), and promtool (`promtool check rules` of
# ops/prometheus/alerts.yml; Debian ships it only in the `prometheus` package: ~19 MB to download, ~96 MB
# installed, and it brings the Prometheus server's unit, which a systemd host starts; installed without
# its recommends, so without the node exporter). Installed only when missing.
system-deps:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v faketime >/dev/null 2>&1 || missing="$$missing faketime"; \
	command -v nft >/dev/null 2>&1 || missing="$$missing nftables"; \
	{ command -v pgbouncer || test -x /usr/sbin/pgbouncer; } >/dev/null 2>&1 || missing="$$missing pgbouncer"; \
	command -v systemd-nspawn >/dev/null 2>&1 || missing="$$missing systemd-container"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	elif [ -n "$$missing" ]; then \
	  echo "missing Debian packages:$$missing (install them as root)"; \
	fi; \
	if ! command -v promtool >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing: prometheus (for promtool)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else \
	    echo "missing Debian package: prometheus (promtool; install it as root)"; \
	  fi; \
	fi

lint: install
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/mypy $(LINT_PATHS)

# The alert rules: valid, and they fire on the series they are for (tests/api/test_metrics.py runs the same).
rules:
	promtool check rules ops/prometheus/alerts.yml
	cd ops/prometheus && promtool test rules alerts_test.yml

# pytest's arguments: two pytest-xdist workers by default (each starts its own throwaway PostgreSQL
# cluster; `--dist loadfile` keeps a file on one worker, so a module's shared processes start once). The
# suite mostly waits on processes, so two workers on two cores take about half the time of one.
# `--no-loadscope-reorder`: the files go out in the collection's order, the longest first (tests/conftest.py
# LONGEST_FIRST), instead of by their number of tests, which left the long one-test files for the end.
# `make test PYTEST_ARGS=` runs it in one process.
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder

test: install system-deps lint rules
	$(PY) -m pytest $(PYTEST_ARGS)

dev: install
	$(VENV)/bin/scrinalia dev

# The wheel and the sdist an installation is made from (docs/install.md): dist/scrinalia_runner-VERSION-py3-none-any.whl
# and dist/scrinalia_runner-VERSION.tar.gz. The wheel carries the migrations, the panel and the unit templates.
dist: install
	rm -rf dist build
	$(PY) -m build --outdir dist .

bench: install
	for script in bench/bench_*.py; do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) .scrinalia .pytest_cache .mypy_cache .ruff_cache dist build

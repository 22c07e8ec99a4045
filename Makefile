# gpumon developer tasks.
#   make run          set up a venv with the daemon's dependencies only (versions from the lock) and run it
#                     (real GPUs when the NVIDIA driver is there, simulated otherwise)
#   make test         add the test extras and torch (pinned CPU build) to that venv, from the lock; as root
#                     install Debian's prometheus, alertmanager, slurm, munge, tmux (it says so first;
#                     APT=no skips it: the tests that need them skip with their reason); then ruff, mypy
#                     and the suite
#   make test-latest  the same suite in .venv-latest with the newest release of every dependency (no lock)
#   make lock         refresh requirements/lock.txt to the newest releases that pyproject.toml allows
VENV ?= .venv
PY := $(VENV)/bin/python
# The suite mostly waits (on servers, daemons, timeouts): four pytest workers (pytest-xdist), one test file each
# at a time, keep a 2-core machine busy. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 4
# Every install for `make run` and `make test` takes its versions from this file (pip constraints), so a
# commit passes or fails the same way on any day; pyproject.toml keeps the loose ranges users install with.
LOCK := requirements/lock.txt
TORCH := requirements/torch-cpu.in
LATEST_VENV := .venv-latest
LISTEN ?= 127.0.0.1:10480
BACKEND ?= $(shell (ldconfig -p 2>/dev/null | grep -q libnvidia-ml.so) && echo nvml || echo fake)

.PHONY: setup run-setup run test test-latest suite lock test-faults test-deps lint typecheck check golden docs generate

# Two stamps: the daemon's own dependencies (make run), then the test extras and torch (make test).
# torch stays pinned: an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.run-installed: pyproject.toml $(LOCK)
	@echo "make: installing gpumon and its dependencies into $(VENV) (versions from $(LOCK); ~20 s the first time)"
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e . -c $(LOCK)
	touch $@

$(VENV)/.test-installed: $(VENV)/.run-installed $(TORCH)
	@echo "make: installing the test extras and torch (CPU build, ~200 MB) into $(VENV) (about a minute the first time)"
	$(PY) -m pip install -q -e '.[test]' -r $(TORCH) -c $(LOCK)
	touch $@

run-setup: $(VENV)/.run-installed
setup: $(VENV)/.test-installed

run: run-setup
	$(VENV)/bin/gpumon run --backend $(BACKEND) --listen $(LISTEN) --state-dir .state

# promtool, amtool, prometheus, alertmanager, systemd-analyze, openssl and a Slurm controller, node and munge
# for the integration tests (Debian packages).
TEST_TOOLS := promtool amtool prometheus prometheus-alertmanager systemd-analyze openssl slurmctld slurmd scontrol munged tmux
TEST_PACKAGES := prometheus prometheus-alertmanager systemd openssl slurmctld slurmd slurm-client munge tmux
# APT=no: never install Debian packages (the tests that need a missing tool skip, each with its reason).
APT ?= yes
test-deps:
	@missing=""; for t in $(TEST_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$(APT)" = no ]; then echo "NOTE: missing$$missing (APT=no): the tests that need them will be skipped (with reasons)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "make: missing$$missing: installing Debian packages as root with apt-get: $(TEST_PACKAGES)"; \
		echo "      (make test APT=no skips this; the tests that need them then skip with their reason)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(TEST_PACKAGES) >/dev/null; \
	else echo "NOTE: missing$$missing and not root: the tests that need them will be skipped (with reasons)"; fi

# The whole suite: ruff, mypy --strict on gpumon/, the import contracts (lint-imports, pyproject.toml), then pytest (real Prometheus/Alertmanager included).
test: setup test-deps
	$(MAKE) --no-print-directory suite VENV=$(VENV)

# ruff, mypy, lint-imports and pytest with the venv named by VENV, as it is (make test and make test-latest set it up).
suite:
	$(VENV)/bin/ruff check gpumon tests benchmarks dashboards
	$(VENV)/bin/ruff format --check gpumon
	$(VENV)/bin/mypy gpumon
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The same suite against the newest release of every dependency pyproject.toml allows (torch stays at the
# pinned CPU build), in a venv of its own; it prints the versions it tested. Upgrades are a choice: when this
# passes, `make lock` moves the lock to those versions.
test-latest: test-deps
	python3 -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade --upgrade-strategy=eager -e '.[test]' -r $(TORCH)
	$(LATEST_VENV)/bin/python -m pip freeze --exclude-editable | tee $(LATEST_VENV)/tested-versions.txt
	$(MAKE) --no-print-directory suite VENV=$(LATEST_VENV)

# Refresh the lock with pip-tools (in the test extra): the newest releases pyproject.toml allows, torch at the pinned CPU build.
lock: setup
	CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile -q --upgrade --strip-extras --extra test --no-emit-index-url \
		--no-emit-find-links -o $(LOCK) pyproject.toml $(TORCH)

# The daemon under faults, as one suite (also part of make test): receiver down for thousands of
# attempts then back, hang + reload + stop in every order, broken files on reload, NVML UNKNOWN, XID sources.
test-faults: setup test-deps
	$(PY) -m pytest -q -m faults

lint: setup
	$(VENV)/bin/ruff check gpumon tests benchmarks dashboards
	$(VENV)/bin/ruff format --check gpumon
	$(VENV)/bin/lint-imports

typecheck: setup
	$(VENV)/bin/mypy gpumon

check: test

golden: setup
	$(PY) -c "from tests.test_exporter import golden_exposition, GOLDEN; GOLDEN.write_text(golden_exposition())"
	$(PY) -c "from tests.replayed import write_goldens; write_goldens()"

# The field tables of docs/nvml-notes.md and docs/dcgm-compat.md, from the declarations in gpumon/model/fields/
# (tests/test_fields.py fails when the checked-in pages differ).
docs: setup
	$(PY) -m gpumon.exposition.doctables

# Every generated file at once, after adding or changing a field or a panel: the golden exposition, the field
# tables of docs/ and the dashboards (dashboards/generate.py). The tests fail while any of them is stale.
generate: golden docs
	$(PY) dashboards/generate.py

# A fleet in a box (docs/fleet.md): NODES Slurm nodes in network namespaces, each with a gpumon daemon on a
# simulated scenario, a Prometheus with gpumon's rules and an Alertmanager HA pair. Needs root and test-deps.
NODES ?= 3
cluster: setup test-deps
	@echo "make cluster: building a $(NODES)-node fleet box (Slurm, a gpumon daemon per node, Prometheus, two Alertmanagers): about 20 s"
	$(PY) -m tests.fleet.box up --nodes $(NODES)
cluster-down:
	$(PY) -m tests.fleet.box down

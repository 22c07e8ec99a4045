# gpumon developer tasks.
#   make run    set up a venv with the daemon's dependencies only and run it (real GPUs when the NVIDIA
#               driver is there, simulated otherwise)
#   make test   add the test extras and torch (pinned CPU build) to that venv, as root install Debian's
#               prometheus + alertmanager, then run ruff, mypy and the whole suite
VENV ?= .venv
PY := $(VENV)/bin/python
LISTEN ?= 127.0.0.1:10480
BACKEND ?= $(shell (ldconfig -p 2>/dev/null | grep -q libnvidia-ml.so) && echo nvml || echo fake)

.PHONY: setup run-setup run test test-faults test-deps lint typecheck check golden docs

# Two stamps: the daemon's own dependencies (make run), then the test extras and torch (make test).
# torch stays pinned: an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.run-installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.test-installed: $(VENV)/.run-installed
	$(PY) -m pip install -q -e '.[test]' 'torch==2.13.0'
	touch $@

run-setup: $(VENV)/.run-installed
setup: $(VENV)/.test-installed

run: run-setup
	$(VENV)/bin/gpumon run --backend $(BACKEND) --listen $(LISTEN) --state-dir .state

# promtool, amtool, prometheus, alertmanager, systemd-analyze, openssl and a Slurm controller, node and munge
# for the integration tests (Debian packages).
TEST_TOOLS := promtool amtool prometheus prometheus-alertmanager systemd-analyze openssl slurmctld slurmd scontrol munged
test-deps:
	@missing=""; for t in $(TEST_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			prometheus prometheus-alertmanager systemd openssl slurmctld slurmd slurm-client munge >/dev/null; \
	else echo "NOTE: missing$$missing and not root: the tests that need them will be skipped (with reasons)"; fi

# The whole suite: ruff, mypy --strict on gpumon/, then pytest (real Prometheus/Alertmanager included).
test: setup test-deps lint typecheck
	$(PY) -m pytest -q

# The daemon under faults, as one suite (also part of make test): receiver down for thousands of
# attempts then back, hang + reload + stop in every order, broken files on reload, NVML UNKNOWN, XID sources.
test-faults: setup test-deps
	$(PY) -m pytest -q -m faults

lint: setup
	$(VENV)/bin/ruff check gpumon tests benchmarks dashboards
	$(VENV)/bin/ruff format --check gpumon

typecheck: setup
	$(VENV)/bin/mypy gpumon

check: test

golden: setup
	$(PY) -c "from tests.test_exporter import golden_exposition, GOLDEN; GOLDEN.write_text(golden_exposition())"

# The field tables of docs/nvml-notes.md and docs/dcgm-compat.md, from the declarations in gpumon/fields/
# (tests/test_fields.py fails when the checked-in pages differ).
docs: setup
	$(PY) -m gpumon.doctables

"""Fixtures shared by every test module (helpers live in tests/helpers.py)."""

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from gpumon.backends.nvml import NvmlBackend
from tests.fake_pynvml import FakeNvml, h200_pair
from tests.helpers import FULL_EXAMPLES_FACTOR, start_daemon
from tests.pki import OPENSSL, Pki, make_pki
from tests.prometheus_helpers import PROMETHEUS, SharedPrometheus, run_shared_prometheus

__all__ = ["pki", "start_daemon"]

# Property tests: random examples on a developer's machine (where they keep finding new cases),
# the same examples on every CI run (CI=true), so that a submission's result does not depend on
# the draw; no per-example deadline on a shared 2-core box. Both draw a tenth of the full count of
# examples (tests/helpers.py ``examples``); HYPOTHESIS_PROFILE=full draws every one, at random
# (a few minutes more: run it before a release or after changing a parser).
settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.register_profile("full", max_examples=FULL_EXAMPLES_FACTOR * 100, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev"))

# A key a backend returns that is no GpuSnapshot field fails the tests (pollers, and daemons started
# as subprocesses, raise instead of logging it): see gpumon/collect/poller.py.
os.environ.setdefault("GPUMON_STRICT_FIELDS", "1")


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates for TLS tests, made once per session; skips where openssl is missing."""
    if OPENSSL is None:
        pytest.skip("openssl command not installed (Debian package: openssl)")
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def shared_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedPrometheus]:
    """One real Prometheus for the test files that only need one scraping gpumon over plain HTTP
    (the dashboard files): each adds its daemon with ``scrape``; started at first use."""
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (Debian package: prometheus)")
    with run_shared_prometheus(tmp_path_factory.mktemp("prometheus")) as prometheus:
        yield prometheus


@pytest.fixture
def fake() -> FakeNvml:
    """Two simulated H200s behind the fake pynvml module (tests/fake_pynvml.py)."""
    return h200_pair()


@pytest.fixture
def backend(fake: FakeNvml) -> NvmlBackend:
    """The real NVML backend over ``fake``, initialised."""
    b = NvmlBackend(fake)
    b.init()
    return b

"""Per-GPU fields declared once (gpumon/model/fields/): what follows from a declaration, and what a
backend may return."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import pytest

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import STRICT_FIELDS_ENV, Poller, UnknownFieldError
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.dcgm_table import DCGM_ORDER, dcgm_fields
from gpumon.exposition.metrics import gpu_rows
from gpumon.model.fields.spec import FieldSpec, Metric
from gpumon.model.snapshot import GpuSnapshot, Tier, field_specs


class TypoBackend(FakeBackend):
    """A fake GPU whose FAST reader returns one key that is no field (as a reader's typo would)."""

    def read(self, index: int, tier: Tier) -> Mapping[str, Any]:
        values = dict(super().read(index, tier))
        if tier is Tier.FAST:
            values["temprature_celsius"] = 51.0
        return values


def test_the_test_suite_runs_strict() -> None:
    import os

    assert os.environ.get(STRICT_FIELDS_ENV) == "1"  # tests/conftest.py


def test_a_strict_poller_raises_on_a_key_that_is_no_field() -> None:
    poller = Poller(TypoBackend.from_mapping({"count": 1}), SnapshotStore(), host_figures=dict, strict_fields=True)
    with pytest.raises(UnknownFieldError, match="temprature_celsius"):
        poller.poll()


def test_a_poller_made_in_tests_is_strict_by_default() -> None:
    poller = Poller(TypoBackend.from_mapping({"count": 1}), SnapshotStore(), host_figures=dict)
    with pytest.raises(UnknownFieldError):
        poller.poll()


def test_outside_tests_the_key_is_logged_once_counted_and_the_rest_kept(caplog: pytest.LogCaptureFixture) -> None:
    poller = Poller(TypoBackend.from_mapping({"count": 1}), SnapshotStore(), host_figures=dict, strict_fields=False)
    with caplog.at_level(logging.ERROR, logger="gpumon.collect"):
        snapshots = [poller.poll() for _ in range(3)]
    assert all(s.gpus[0].temperature_celsius == 30.0 for s in snapshots)
    assert poller.unknown_fields() == {"temprature_celsius": 3}
    assert [r.getMessage() for r in caplog.records if "temprature_celsius" in r.getMessage()] == [
        "the backend returned 'temprature_celsius', which is no GpuSnapshot field: left out (a bug)"
    ]


@pytest.mark.parametrize("key", ["up", "lost_reason", "index", "uuid"])
def test_a_key_field_in_a_read_is_no_field_the_backend_may_set(key: str) -> None:
    class KeyBackend(FakeBackend):
        def read(self, index: int, tier: Tier) -> Mapping[str, Any]:
            values = dict(super().read(index, tier))
            if tier is Tier.FAST:
                values[key] = {"up": False, "lost_reason": "x", "index": 7, "uuid": "GPU-x"}[key]
            return values

    with pytest.raises(UnknownFieldError, match=key):
        Poller(KeyBackend.from_mapping({"count": 1}), SnapshotStore(), host_figures=dict, strict_fields=True).poll()
    poller = Poller(KeyBackend.from_mapping({"count": 1}), SnapshotStore(), host_figures=dict, strict_fields=False)
    gpu = poller.poll().gpus[0]
    assert (gpu.index, gpu.up, gpu.lost_reason) == (0, True, None)
    assert poller.unknown_fields() == {key: 1}


def test_every_field_but_the_key_is_declared() -> None:
    key = {"index", "uuid", "up", "lost_reason"}
    for f in dataclasses.fields(GpuSnapshot):
        assert (f.name in key) != isinstance(f.metadata.get("spec"), FieldSpec), f.name
    assert [name for name, _ in field_specs()] == [f.name for f in dataclasses.fields(GpuSnapshot)][4:]


def test_every_family_is_declared_once_and_named_for_gpumon() -> None:
    names = [row.name for row in gpu_rows()]
    assert len(names) == len(set(names))
    assert all(name.startswith("gpumon_") for name in names)
    declared = [m.name for _, spec in field_specs() for m in spec.metrics if isinstance(m, Metric)]
    assert names == declared


def test_every_dcgm_twin_is_declared_once_and_has_a_value() -> None:
    names = [f.name for f in dcgm_fields()]
    assert len(names) == len(set(names))
    assert all(name.startswith("DCGM_FI_") for name in names)
    assert len(names) == sum(len(spec.dcgm) for _, spec in field_specs())
    assert set(DCGM_ORDER) <= set(names)  # the pinned order names no twin that is gone


def test_fields_with_an_nvml_call_say_which_nvidia_smi_field_they_match() -> None:
    for name, spec in field_specs():
        if spec.tier is not Tier.DAEMON:
            assert spec.nvml, name
            assert spec.smi, name


def test_the_generated_doc_tables_are_what_make_docs_writes() -> None:
    from gpumon.exposition.doctables import expected

    for path, text in expected().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is stale: run `make generate` (or `make docs`)"


def test_make_docs_keeps_the_prose_and_replaces_only_the_table() -> None:
    from gpumon.exposition.doctables import render

    page = "intro\n<!-- generated: t, `make docs` -->\n| old |\n<!-- end generated -->\noutro\n"
    assert (
        render(page, "t", "| new |")
        == "intro\n<!-- generated: t, `make docs` -->\n| new |\n<!-- end generated -->\noutro\n"
    )
    with pytest.raises(ValueError, match="markers"):
        render("no markers", "t", "| new |")

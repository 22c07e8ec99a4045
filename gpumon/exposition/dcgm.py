"""dcgm-exporter's metric names, labels and units, from gpumon's snapshots (``--compat dcgm``, ``dcgm-4.9``).

So that dashboards and alert rules written for NVIDIA's dcgm-exporter work unchanged:
the same ``DCGM_FI_*`` names, the same units (MHz, MiB, %, mJ, ns up to 4.8.x; 4.9's
in gpumon.exposition.dcgm_sets) and the same per-GPU label set as dcgm-exporter's GPU
template: ``gpu`` (index), ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<index>``),
``modelName``, ``Hostname`` or ``hostname`` (omitted when empty, as dcgm-exporter does with
``--no-hostname``) and ``DCGM_FI_DRIVER_VERSION`` or ``DCGM_FI_SYSTEM_DRIVER_VERSION``.
Served together, two sets share the families neither renamed (one series, both sets' labels).

Two deliberate differences, both documented in docs/dcgm-compat.md:

* dcgm-exporter declares some fields ``counter`` although their names do not end in
  ``_total`` (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, ..._REMAPPED_ROWS, ECC totals).
  The Prometheus client and OpenMetrics require a counter's samples to end in
  ``_total``, so gpumon types them ``untyped``: same names, same values, and
  ``rate()`` / ``increase()`` work on them as before.
* DCGM_FI_DEV_XID_ERRORS is the code of the last XID (0 when none), as in DCGM; the
  count of every XID is in ``gpumon_xid_errors_total``.

A series is omitted when its snapshot field is None (not supported, not read yet, or
the GPU is lost), like dcgm-exporter skips blank values.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping, Sequence

from gpumon.collect.store import SnapshotStore
from gpumon.exposition.dcgm_sets import DCGM_SETS, HPC_JOB, LABEL_FIELDS, LEGACY, LabelField
from gpumon.exposition.dcgm_table import last_xid, served_fields
from gpumon.exposition.text import needs_escaping
from gpumon.model.families import Family
from gpumon.model.snapshot import GpuSnapshot, Snapshot
from gpumon.model.xid_catalog import XidCatalog
from gpumon.util.reuse import ReuseSealed

log = logging.getLogger(__name__)


def node_name(env: Mapping[str, str]) -> str:
    """The host label's value, as dcgm-exporter takes it: $NODE_NAME (its Helm chart sets it from
    the pod's spec.nodeName) when set, else the host name."""
    return env.get("NODE_NAME") or socket.gethostname()


def _hpc_jobs(gpu: GpuSnapshot) -> list[str]:
    """The Slurm jobs of the GPU's processes, in order: dcgm-exporter's ``hpc_job`` values."""
    jobs = {p.slurm_job_id for p in gpu.processes or () if p.slurm_job_id}
    return sorted(jobs, key=lambda job: (len(job), job))


_BASE_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
Labels = tuple[str, ...]


class DcgmCompatCollector:
    """A metric source of dcgm-exporter's families from the latest snapshot."""

    def __init__(
        self,
        store: SnapshotStore,
        hostname: str,
        catalog: XidCatalog | None = None,
        *,
        sets: Sequence[str] = (LEGACY,),
        hostname_label: str | None = None,
        labels: Sequence[str] = (),
    ) -> None:
        """``hostname``: the host label's value (dcgm-exporter uses the node name); "" leaves it out.

        ``catalog``: gives ``err_msg`` on the XID family, as newer dcgm-exporters do.
        ``sets``: the name sets to serve (``dcgm``, ``dcgm-4.9``, or both for a migration).
        ``hostname_label``: ``Hostname`` or ``hostname`` for every set; None: each set's own
        (``Hostname`` up to dcgm-exporter 4.8.2, ``hostname`` in 4.9).
        ``labels``: optional labels (``COMPAT_LABELS``): dcgm-exporter's label rows and ``hpc_job``.
        """
        self._store = store
        self._hostname = hostname
        self._catalog = catalog
        self._sets = [DCGM_SETS[name] for name in sets]
        self._host_labels = [hostname_label or s.hostname_label for s in self._sets]
        self._label_fields = [LABEL_FIELDS[name] for name in labels if name in LABEL_FIELDS]
        self._hpc_job = HPC_JOB in labels
        self._fields = served_fields(sets)
        self._of_snapshot: ReuseSealed[Family] = ReuseSealed()
        """The families of the last snapshot built, with the catalog they were built with."""

    def set_catalog(self, catalog: XidCatalog) -> None:
        """Use ``catalog`` for ``err_msg`` from the next scrape on (a reload changed ``xid_catalog``)."""
        self._catalog = catalog

    def _label_names(self, snapshot: Snapshot, set_indices: Sequence[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The label names of a family served by ``set_indices``, and those of them a sample may lack."""
        names: list[str] = list(_BASE_LABELS)
        optional: list[str] = []

        def add(name: str, may_lack: bool = False) -> None:
            if name not in names:
                names.append(name)
                if may_lack:
                    optional.append(name)

        for i in set_indices:
            if self._hostname:
                add(self._host_labels[i])
        for i in set_indices:
            if snapshot.host.driver_version:
                add(self._sets[i].driver_label)
        for i in set_indices:
            for label in self._label_fields:
                add(self._sets[i].label_name(label), may_lack=True)
        if self._hpc_job:
            add(HPC_JOB, may_lack=True)
        return tuple(names), tuple(optional)

    def _label_values(self, gpu: GpuSnapshot, snapshot: Snapshot) -> list[dict[str, str]]:
        """The GPU's label values by name, every spelling of every set; one per HPC job when asked."""
        values = {
            "gpu": str(gpu.index),
            "UUID": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id or "",
            "device": f"nvidia{gpu.index}",
            "modelName": gpu.name or "",
        }
        for i, dset in enumerate(self._sets):
            values[self._host_labels[i]] = self._hostname
            values[dset.driver_label] = snapshot.host.driver_version or ""
            for label in self._label_fields:
                values[dset.label_name(label)] = _label_field_value(label, gpu, snapshot)
        if not self._hpc_job:
            return [values]
        jobs = _hpc_jobs(gpu)
        return [{**values, HPC_JOB: job} for job in jobs] or [values]

    def families(self) -> list[Family]:
        """The families of the latest snapshot, built once per snapshot: every scrape of it
        (several scrapers, text and OpenMetrics) reuses them and their rendered text."""
        snapshot = self._store.latest()
        if snapshot is None:
            return []
        catalog = self._catalog
        return self._of_snapshot.get(lambda: self._build(snapshot, catalog), same=(snapshot, catalog))

    def _build(self, snapshot: Snapshot, catalog: XidCatalog | None) -> list[Family]:
        gpus = [(gpu, self._label_values(gpu, snapshot)) for gpu in snapshot.gpus if gpu.up]
        plain = not needs_escaping(v for _, variants in gpus for values in variants for v in values.values())
        # per group of sets: the label names, those a sample may lack, and each GPU's label tuples (made once)
        heads: dict[tuple[int, ...], tuple[Labels, Labels, list[tuple[GpuSnapshot, Labels]]]] = {}
        out = []
        for spec in self._fields:
            head = heads.get(spec.sets)
            if head is None:
                names, optional = self._label_names(snapshot, spec.sets)
                rows = [(gpu, tuple(values.get(n, "") for n in names)) for gpu, variants in gpus for values in variants]
                head = heads[spec.sets] = (names, optional, rows)
            names, optional, rows = head
            family = Family(spec.name, spec.kind, spec.help, names, plain_labels=plain, optional_labels=optional)
            samples = family.samples
            value_of = spec.value
            for gpu, labels in rows:  # a GPU with several HPC jobs comes once per job
                value = value_of(gpu)
                if value is not None:
                    samples.append((labels, float(value)))
            if samples:
                out.append(family)
        for i, dset in enumerate(self._sets):
            xid = self._xid_family(dset.same_unit.get(_XID, _XID), (i,), snapshot, gpus, catalog)
            if xid.samples:
                out.append(xid)
        return out

    def _xid_family(
        self,
        name: str,
        set_indices: tuple[int, ...],
        snapshot: Snapshot,
        gpus: list[tuple[GpuSnapshot, list[dict[str, str]]]],
        catalog: XidCatalog | None,
    ) -> Family:
        names, optional = self._label_names(snapshot, set_indices)
        xid_names = (*names, "err_code") if catalog is None else (*names, "err_code", "err_msg")
        xid = Family(name, "gauge", "Value of the last XID error encountered.", xid_names, optional_labels=optional)
        for gpu, variants in gpus:
            code = last_xid(gpu)
            if code is None:
                continue
            extra: tuple[str, ...] = (str(code),)
            if catalog is not None:
                extra += ("No Error" if code == 0 else catalog.lookup(code).meaning,)
            for values in variants:
                xid.add((*(values.get(n, "") for n in names), *extra), float(code))
        return xid


_XID = "DCGM_FI_DEV_XID_ERRORS"


def _label_field_value(label: LabelField, gpu: GpuSnapshot, snapshot: Snapshot) -> str:
    if label is LABEL_FIELDS["nvml_version"]:
        return snapshot.host.nvml_version or ""
    if label is LABEL_FIELDS["serial"]:
        return gpu.serial or ""
    return gpu.vbios_version or ""

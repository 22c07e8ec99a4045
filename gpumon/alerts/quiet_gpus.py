"""Which GPUs a snapshot rule may pass over: those where it observed nothing at the last snapshot and
whose fields it reads are equal to what it read there.

What a per-GPU snapshot rule observes on one GPU follows from the fields it reads there
(``input_fields``), the GPU's identity (index, uuid), whether an alert of the rule is open on it,
and the observer's memory of the GPU (the ECC baseline, the links seen up), which moves only when
those fields do. When the rule observed nothing on a GPU (no alert to start, keep or resolve
there), no alert of it is open there (only an observation opens one) and its memory is settled, so
the same fields give nothing again. A GPU with a pending or firing alert of the rule, or whose
fields changed, is observed as before, so ``for:`` and ``keep_firing_for`` count at every snapshot.

Most polls most rules observe nothing anywhere. Every field some rule reads is taken once a GPU, as
one row (one ``operator.attrgetter`` call a GPU, in C, the GPU's identity first): while no GPU's row
changed (an idle host, most polls), no column did. When one did, what each set of fields reads is
taken for all GPUs at once, a column (one ``attrgetter`` call a GPU; rules that read the same fields
share it), and compared with the last column whole. Snapshots are never changed once
published, so equal values are the same inputs. The memory is dropped (everything observed at the
next snapshot) when a GPU is replaced or moved, and when the engine's rules or state are replaced.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpumon.alerts.observation import Observation
from gpumon.alerts.rules import DERIVED_FIELD_INPUTS, Rule
from gpumon.model.snapshot import GpuSnapshot

KIND_INPUTS: Mapping[str, tuple[str, ...]] = {
    "ecc_uncorrectable": ("ecc_errors_total",),
    "nvlink_down": ("nvlink_up",),
    "pcie_degraded": (
        "utilization_ratio",
        "pcie_link_generation",
        "pcie_link_width",
        "pcie_link_generation_max",
        "pcie_link_width_max",
    ),
    "idle_with_memory": ("utilization_ratio", "memory_used_bytes", "processes"),
}
"""The GpuSnapshot fields each per-GPU rule kind but ``threshold`` reads (besides ``up``); those that change
most often first, so that comparing two GPUs' values stops early."""

PER_GPU_KINDS = frozenset({"threshold", *KIND_INPUTS})
"""The snapshot rule kinds observed GPU by GPU (the others watch the host, or XIDs and findings)."""

_IDENTITY = operator.attrgetter("index", "uuid")

Column = tuple[tuple[object, ...], ...]
"""The values of some fields on each GPU of a snapshot, in the snapshot's order."""


def input_fields(rule: Rule) -> tuple[str, ...]:
    """The GpuSnapshot fields per-GPU ``rule`` reads of each GPU, ``up`` first (every kind reads it)."""
    if rule.kind != "threshold":
        return ("up", *KIND_INPUTS[rule.kind])
    name = rule.field or ""
    base, dot, _ = name.partition(".")
    return ("up", *DERIVED_FIELD_INPUTS.get(name, (base,) if dot else (name,)))


class _Inputs:
    """One set of input fields: its getter, and its column at the latest snapshot with a version that
    changes whenever the column does."""

    __slots__ = ("column", "getter", "version")

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.getter: Callable[[GpuSnapshot], Any] = operator.attrgetter(*fields)
        self.column: Column | None = None
        self.version = 0


class QuietGpus:
    """For each per-GPU snapshot rule: the GPUs where it observed nothing, and the values it read there."""

    def __init__(self) -> None:
        self._inputs: dict[str, _Inputs] = {}
        """Each per-GPU rule's input fields (shared by rules that read the same fields), by rule name."""
        self._distinct: tuple[_Inputs, ...] = ()
        self._row_of: Callable[[GpuSnapshot], tuple[object, ...]] = _IDENTITY
        """A GPU's identity and every field a per-GPU rule reads, in one ``attrgetter`` (each field read once)."""
        self._rows: tuple[tuple[object, ...], ...] | None = None
        """Each GPU's row at the latest snapshot: while it is equal, no column and no identity changed."""
        self._identities: tuple[tuple[object, ...], ...] = ()
        self._gpus: Sequence[GpuSnapshot] = ()
        self._memo: dict[str, tuple[int, Column, bool, list[bool]]] = {}
        """Rule name -> at its last observation: (its inputs' version, their column, quiet everywhere, quiet on
        each GPU). A rule whose observation was cut short (an exception) keeps an older version."""

    def set_rules(self, rules: Iterable[Rule]) -> None:
        """Take ``rules`` (config load, SIGHUP): their getters made once; every GPU observed at the next snapshot."""
        fields_of = {rule.name: input_fields(rule) for rule in rules if rule.kind in PER_GPU_KINDS}
        every = ("index", "uuid", *dict.fromkeys(f for fields in fields_of.values() for f in fields))
        by_fields: dict[tuple[str, ...], _Inputs] = {}
        self._inputs = {name: by_fields.setdefault(fields, _Inputs(fields)) for name, fields in fields_of.items()}
        self._distinct = tuple(by_fields.values())
        self._row_of = operator.attrgetter(*every)
        self._rows = None
        self.forget()

    def forget(self) -> None:
        """Observe every GPU for every rule at the next snapshot (the engine's state was replaced)."""
        self._memo.clear()

    def begin(self, gpus: Sequence[GpuSnapshot]) -> set[str]:
        """Take a new snapshot's GPUs; returns the per-GPU rules that observe nothing on any of them: those
        quiet everywhere last time whose inputs did not change. A GPU replaced, added, gone or moved: none.

        Each GPU's inputs are read once, as one row (in C); the identities and the columns are taken
        again only when a row changed (on an idle host most polls none did)."""
        rows = tuple(map(self._row_of, gpus))
        self._gpus = gpus
        if rows != self._rows:
            self._rows = rows
            identities = tuple(map(_IDENTITY, gpus))
            if identities != self._identities:
                self._identities = identities
                self._memo.clear()
            for inputs in self._distinct:  # each set of fields' column; written out, no call per set
                column = tuple(map(inputs.getter, gpus))
                if column != inputs.column:
                    inputs.column = column
                    inputs.version += 1
        memo, inputs_of = self._memo, self._inputs
        return {name for name, last in memo.items() if last[2] and last[0] == inputs_of[name].version}

    def observe(self, rule: Rule, observe_gpu: Callable[[GpuSnapshot], list[Observation]]) -> list[Observation]:
        """``rule``'s observations on this snapshot's GPUs: ``observe_gpu`` of each GPU but those where
        the rule observed nothing last time and reads the same values now."""
        inputs = self._inputs[rule.name]
        column = inputs.column
        assert column is not None
        last = self._memo.get(rule.name)
        out: list[Observation] = []
        quiet: list[bool] = []
        for i, gpu in enumerate(self._gpus):
            if last is not None and last[3][i] and last[1][i] == column[i]:
                quiet.append(True)
                continue
            seen = observe_gpu(gpu)
            quiet.append(not seen)
            out.extend(seen)
        self._memo[rule.name] = (inputs.version, column, all(quiet), quiet)
        return out

"""Energy per owner: each GPU's energy counter split among the Slurm jobs, pods, containers and
systemd units whose processes hold it, as counters and as a record of each finished owner.

**Measure.** Every poll, each GPU's owners (from its compute processes: ``slurm_job`` when /proc
says the process is in a Slurm job, else ``pod``, else ``container``, else ``systemd_unit``, else
``none``) each get a share of that poll: the owners' SM time shares
(``nvmlDeviceGetProcessUtilization``) when every process reports one and they add up to more than
0, otherwise equal shares. When the GPU's energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
slow tier) moves, the joules since its last value go to the owners in proportion to the shares they
gathered over the polls in between; the polls in which no process held the GPU keep their part
(idle energy goes to nobody). A counter that goes down (a GPU reset, a driver reload) starts over
without a jump. A daemon that restarts starts its counters at 0 (Prometheus sees a counter reset).

**Series** (the host's, summed over its GPUs; ``instance`` comes from Prometheus):

* ``gpumon_owner_energy_joules_total{owner_kind, owner}`` — joules the owner's processes used
* ``gpumon_owner_active{owner_kind, owner}`` — 1 while its processes hold a GPU, 0 after

**Bounded cardinality.** An owner not seen on any GPU for ``keep_seconds`` (10 minutes) is
dropped from the exposition, and the daemon appends its record, one JSON line, to
``STATE_DIR/energy/owners.jsonl``::

    {"owner_kind": "slurm_job", "owner": "42", "joules": 1234.5, "gpus": ["GPU-..."],
     "first_seen_seconds": 1700000000.0, "last_seen_seconds": 1700003600.0}

At most ``max_owners`` (1000) owners are kept at once: past that the one seen longest ago is dropped
(and recorded) first. The record file is renamed to ``owners.jsonl.1`` once it passes 16 MiB
(one older generation kept), so it never grows without bound either.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.model.families import Family
from gpumon.model.snapshot import ProcessSnapshot, Snapshot
from gpumon.util.state.files import append_line

OWNER_KINDS = ("slurm_job", "pod", "container", "systemd_unit", "none")
DEFAULT_KEEP_SECONDS = 600.0
DEFAULT_MAX_OWNERS = 1000
MAX_RECORD_BYTES = 16 * 2**20
RECORD_FILE = Path("energy") / "owners.jsonl"

Owner = tuple[str, str]
"""(owner_kind, owner)."""


def owner_of(process: ProcessSnapshot) -> Owner:
    """Who a compute process's GPU time belongs to (the outermost claim /proc makes)."""
    claim = process.job_claim
    if claim is not None:
        kind, owner = claim
        return (kind, owner[:12]) if kind == "container" else claim
    if process.systemd_unit:
        return ("systemd_unit", process.systemd_unit)
    return ("none", "")


def shares(processes: Iterable[ProcessSnapshot]) -> dict[Owner, float]:
    """Each owner's share of one poll of a GPU, adding up to 1 (empty: no process holds it).

    By SM time share when every process reports one and they add up to more than 0; otherwise
    equal shares per owner (not per process: a job of eight processes counts once)."""
    procs = list(processes)
    if not procs:
        return {}
    sm = [p.sm_utilization_ratio for p in procs]
    if all(s is not None for s in sm) and sum(s for s in sm if s is not None) > 0:
        total = sum(s for s in sm if s is not None)
        out: dict[Owner, float] = {}
        for p, s in zip(procs, sm, strict=True):
            out[owner_of(p)] = out.get(owner_of(p), 0.0) + (s or 0.0) / total
        return out
    owners = sorted({owner_of(p) for p in procs})
    return dict.fromkeys(owners, 1.0 / len(owners))


@dataclass
class _Gpu:
    last_energy_joules: float | None = None
    gathered: dict[Owner, float] = field(default_factory=dict)
    """Shares gathered by each owner over the polls since the counter last moved."""
    polls: int = 0


@dataclass
class _Account:
    joules: float = 0.0
    gpus: set[str] = field(default_factory=set)
    first_seen_seconds: float = 0.0
    last_seen_seconds: float = 0.0
    last_seen_monotonic: float = 0.0
    active: bool = False


class OwnerEnergy:
    """A store listener (``on_snapshot``) and a metric source (``families``); thread-safe."""

    def __init__(
        self,
        state_dir: str | Path,
        keep_seconds: float = DEFAULT_KEEP_SECONDS,
        max_owners: int = DEFAULT_MAX_OWNERS,
    ) -> None:
        self.record_path = Path(state_dir) / RECORD_FILE
        self.keep_seconds = keep_seconds
        self.max_owners = max_owners
        self._lock = threading.Lock()
        self._gpus: dict[str, _Gpu] = {}
        self._owners: dict[Owner, _Account] = {}

    def on_snapshot(self, snapshot: Snapshot) -> None:
        with self._lock:
            seen: set[Owner] = set()
            for g in snapshot.gpus:
                if not g.up:
                    continue
                gpu = self._gpus.setdefault(g.uuid, _Gpu())
                poll = shares(g.processes or ())
                for owner, share in poll.items():
                    gpu.gathered[owner] = gpu.gathered.get(owner, 0.0) + share
                    account = self._owners.get(owner)
                    if account is None:
                        account = self._owners[owner] = _Account(first_seen_seconds=snapshot.timestamp_seconds)
                    account.gpus.add(g.uuid)
                    account.last_seen_seconds = snapshot.timestamp_seconds
                    account.last_seen_monotonic = snapshot.monotonic_seconds
                    seen.add(owner)
                gpu.polls += 1
                self._count(gpu, g.energy_joules_total)
            for owner, account in self._owners.items():
                account.active = owner in seen
            self._drop(snapshot.monotonic_seconds)

    def _count(self, gpu: _Gpu, energy: float | None) -> None:
        """Split the joules since the counter last moved among the owners that gathered shares."""
        if energy is None or energy == gpu.last_energy_joules:
            return
        if gpu.last_energy_joules is not None and energy > gpu.last_energy_joules:
            joules = energy - gpu.last_energy_joules
            for owner, gathered in gpu.gathered.items():
                if owner in self._owners:
                    self._owners[owner].joules += joules * gathered / gpu.polls
        gpu.last_energy_joules = energy  # first value, or a counter that went down: start from here
        gpu.gathered = {}
        gpu.polls = 0

    def _drop(self, now_monotonic: float) -> None:
        gone = [
            o
            for o, a in self._owners.items()
            if not a.active and now_monotonic - a.last_seen_monotonic >= self.keep_seconds
        ]
        excess = len(self._owners) - len(gone) - self.max_owners
        if excess > 0:
            rest = sorted((a.last_seen_monotonic, o) for o, a in self._owners.items() if o not in gone)
            gone += [o for _, o in rest[:excess]]
        for owner in gone:
            self._record(owner, self._owners.pop(owner))
            for gpu in self._gpus.values():
                gpu.gathered.pop(owner, None)

    def _record(self, owner: Owner, account: _Account) -> None:
        entry = {
            "owner_kind": owner[0],
            "owner": owner[1],
            "joules": round(account.joules, 3),
            "gpus": sorted(account.gpus),
            "first_seen_seconds": account.first_seen_seconds,
            "last_seen_seconds": account.last_seen_seconds,
        }
        try:
            if self.record_path.exists() and self.record_path.stat().st_size > MAX_RECORD_BYTES:
                os.replace(self.record_path, self.record_path.with_name(self.record_path.name + ".1"))
            append_line(self.record_path, entry)
        except OSError:
            pass  # a full or read-only state directory loses the record, never the daemon

    def joules(self, owner_kind: str, owner: str) -> float | None:
        """The owner's joules so far (None: not known, or dropped)."""
        with self._lock:
            account = self._owners.get((owner_kind, owner))
            return None if account is None else account.joules

    def families(self) -> Iterator[Family]:
        with self._lock:
            owners = sorted(self._owners.items())
        energy = Family(
            "gpumon_owner_energy_joules_total",
            "counter",
            "GPU energy used by an owner's processes (Slurm job, pod, container, systemd unit), joules; "
            "a shared GPU splits by SM time share, else equally.",
            ("owner_kind", "owner"),
        )
        active = Family(
            "gpumon_owner_active",
            "gauge",
            "1 while the owner's processes hold a GPU; 0 until its series is dropped (10 minutes later).",
            ("owner_kind", "owner"),
        )
        for (kind, name), account in owners:
            energy.add([kind, name], account.joules)
            active.add([kind, name], 1.0 if account.active else 0.0)
        yield energy
        yield active

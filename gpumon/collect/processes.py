"""Who runs on the GPU: a compute process's name, user and where it runs, from /proc.

NVML gives the pid and the memory of each compute process (nvidia-smi
--query-compute-apps=pid,used_memory); this module adds, from ``/proc/PID``:

* ``name``: ``/proc/PID/comm`` (nvidia-smi's ``process_name`` is the full path);
* ``user``: the real uid in ``/proc/PID/status``, as a user name where the host knows it;
* where it runs, from ``/proc/PID/cgroup`` (cgroup v1 and v2, systemd and cgroupfs
  drivers): the systemd unit, the container id (docker, containerd, CRI-O, podman),
  the Kubernetes pod uid and the Slurm job id;
* ``state``, from ``/proc/PID/stat`` every poll (``D``: uninterruptible sleep, gpumon.health.stuck_processes);
* ``launcher_pid``, from ``/proc/PID/stat`` and its parent's: the process that launched it as
  part of one job (its parent, or itself when the parent is a session leader or init), which
  the straggler detector groups GPUs by when no Slurm job, pod or container says more.

Reads are cached by ``(pid, starttime)`` so a long-running process costs one small
read of ``/proc/PID/stat`` per poll; a reused pid gets a fresh read. A process that
vanished between NVML and /proc is returned as NVML gave it.
"""

from __future__ import annotations

import dataclasses
import pwd
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpumon.model.snapshot import ProcessSnapshot

_HEX_ID = r"[0-9a-f]{12,128}"
_POD_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# systemd-driver scopes (docker-ID.scope, cri-containerd-ID.scope, crio-ID.scope, libpod-ID.scope)
_SCOPE_CONTAINER_RE = re.compile(rf"^(?:docker|cri-containerd|crio|libpod)-(?P<id>{_HEX_ID})\.scope$")
# containerd/cri-o with the systemd driver on cgroup v1 sometimes write "slice:runtime:ID"
_COLON_CONTAINER_RE = re.compile(rf":(?:cri-containerd|crio|docker):(?P<id>{_HEX_ID})$")
_BARE_CONTAINER_RE = re.compile(r"^(?P<id>[0-9a-f]{64})$")
_POD_SLICE_RE = re.compile(rf"^kubepods(?:-[a-z]+)?-pod(?P<uid>{_POD_UID})\.slice$")
_POD_DIR_RE = re.compile(rf"^pod(?P<uid>{_POD_UID})$")
_SLURM_JOB_RE = re.compile(r"^job_(?P<id>\d+)$")
_SLURM_UID_RE = re.compile(r"^uid_\d+$")
_DELEGATED_RE = re.compile(r"^user@\d+\.service$")
_UNIT_RE = re.compile(r"^[^/]+\.(?:service|scope)$")
_RUNTIME_SCOPE_PREFIXES = ("docker-", "cri-containerd-", "crio-", "libpod-")


@dataclass(frozen=True)
class CgroupPlace:
    """Where a process runs, read from its cgroup path(s)."""

    systemd_unit: str | None = None
    """The innermost systemd unit (``foo.service``, ``session-3.scope``), not a container runtime's scope."""
    container_id: str | None = None
    pod_uid: str | None = None
    """Kubernetes pod uid with dashes (the systemd driver writes underscores)."""
    slurm_job_id: str | None = None


def parse_cgroup_path(path: str, made_by_system: Callable[[str], bool] | None = None) -> CgroupPlace:
    """What one cgroup path (``/system.slice/foo.service``, ``/kubepods/burstable/pod…/…``) says. Never raises.

    A Slurm job, pod or container is taken only from a cgroup the system made, as a user may
    create cgroups of their own and name them as they like:

    * nothing at or under a systemd user manager (``user@UID.service``, delegated to the user);
    * a Slurm job only where slurmstepd puts one (``/slurm[_HOST]/uid_N/job_N``, ``…slurmstepd.scope/job_N``);
    * the outermost claim counts: nothing under a container (its inside is its tenant's), no pod
      or container under a Slurm job (slurmstepd delegates a step's ``user`` cgroup to the job's
      user); a container under a pod is kubelet's;
    * ``made_by_system(prefix)``, when given: False for a directory the system did not make (a
      user owns it: a service with ``Delegate=yes``); nothing at or under it counts.

    The systemd unit is the innermost one the system named (not a container runtime's scope): the
    delegated cgroup itself (``user@UID.service``, the ``Delegate=yes`` service, whose folder root made)
    and never one below it, whose name its user chose (``alice-train.service`` under them).
    """
    parts = [p for p in path.split("/") if p]
    unit = None
    container = None
    pod = None
    job = None
    delegated = False
    for i, part in enumerate(parts):
        # a unit's name counts only where the system chose it: not below a delegation (a user names those)
        if not delegated and _UNIT_RE.match(part) and not part.startswith(_RUNTIME_SCOPE_PREFIXES):
            unit = part
        delegated = delegated or bool(_DELEGATED_RE.match(part))
        if delegated or container is not None:
            continue
        if made_by_system is not None and not made_by_system("/" + "/".join(parts[: i + 1])):
            delegated = True
            continue
        if job is None and (m := _SLURM_JOB_RE.match(part)) and pod is None and _slurm_parent(parts, i):
            job = m.group("id")
        if job is not None:
            continue  # (the job's own cgroups below it are slurmstepd's or the job user's)
        found_pod = None
        if m := _SCOPE_CONTAINER_RE.match(part):
            container = m.group("id")
        elif m := _COLON_CONTAINER_RE.search(part):
            container = m.group("id")
            found_pod = _POD_SLICE_RE.match(part[: m.start()])
        elif m := _BARE_CONTAINER_RE.match(part):
            container = m.group("id")
        in_kubepods = any(p.startswith("kubepods") for p in parts[:i])
        found_pod = found_pod or _POD_SLICE_RE.match(part) or (_POD_DIR_RE.match(part) if in_kubepods else None)
        if found_pod and pod is None:
            pod = found_pod.group("uid").replace("_", "-")
    return CgroupPlace(systemd_unit=unit, container_id=container, pod_uid=pod, slurm_job_id=job)


def _slurm_parent(parts: list[str], i: int) -> bool:
    """Whether ``parts[i]`` sits where slurmstepd makes a job's cgroup."""
    if i >= 1 and parts[i - 1].endswith("slurmstepd.scope"):
        return True
    return i == 2 and bool(_SLURM_UID_RE.match(parts[1])) and parts[0].startswith("slurm")


def made_by_system_in(bases: list[Path]) -> Callable[[str], bool]:
    """Whether a cgroup (a path inside a hierarchy mounted at one of ``bases``) was made by the
    system: its directory is owned by root. True where no base has it (nothing to judge by)."""

    def made_by_system(prefix: str) -> bool:
        for base in bases:
            try:
                return (base / prefix.lstrip("/")).stat().st_uid == 0
            except OSError:
                continue
        return True

    return made_by_system


def parse_cgroup_file(text: str, cgroup_root: Path | None = None) -> CgroupPlace:
    """What ``/proc/PID/cgroup`` says (v2 ``0::/path`` and/or v1 ``N:controllers:/path`` lines). Never raises.

    Each attribute comes from the first line that has it, v2 and ``name=systemd``
    lines first, then the v1 controllers in file order. ``cgroup_root``: where the cgroup file
    systems are mounted (``/sys/fs/cgroup``): a directory there that root does not own is not
    the system's (``parse_cgroup_path``); None: the path alone is judged.
    """
    ranked: list[tuple[int, str, str]] = []
    for order, line in enumerate(text.splitlines()):
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        rank = 0 if controllers == "" else 1 if controllers == "name=systemd" else 2
        ranked.append((rank * 10_000 + order, controllers, path))
    place = CgroupPlace()
    for _, controllers, path in sorted(ranked):
        judge = None
        if cgroup_root is not None:
            if controllers == "":
                bases = [cgroup_root, cgroup_root / "unified"]
            else:
                bases = [cgroup_root / controllers.removeprefix("name=")]
            judge = made_by_system_in(bases)
        found = parse_cgroup_path(path, judge)
        place = CgroupPlace(
            systemd_unit=place.systemd_unit or found.systemd_unit,
            container_id=place.container_id or found.container_id,
            pod_uid=place.pod_uid or found.pod_uid,
            slurm_job_id=place.slurm_job_id or found.slurm_job_id,
        )
    return place


@dataclass(frozen=True)
class ProcessInfo:
    """What /proc says about one process."""

    name: str | None
    user: str | None
    place: CgroupPlace
    launcher_pid: int | None = None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def start_time_ticks(proc_root: Path, pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot); None when the process is gone."""
    return state_and_start(proc_root, pid)[1]


def state_and_start(proc_root: Path, pid: int) -> tuple[str | None, int | None]:
    """Fields 3 (the state letter: R, S, D, Z...) and 22 (start time in clock ticks since boot) of
    /proc/PID/stat, in one read; (None, None) when the process is gone."""
    stat = _read(proc_root / str(pid) / "stat")
    if stat is None:
        return None, None
    after_comm = stat.rpartition(")")[2].split()
    # after the comm come field 3 (state) onwards; starttime is field 22
    state = after_comm[0] if after_comm and after_comm[0].isalpha() else None
    try:
        return state, int(after_comm[22 - 3])
    except (IndexError, ValueError):
        return state, None


def _stat_fields(proc_root: Path, pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3, the state, first); None when gone."""
    stat = _read(proc_root / str(pid) / "stat")
    return None if stat is None else stat.rpartition(")")[2].split()


def launcher_pid(proc_root: Path, pid: int) -> int | None:
    """The process that launched ``pid`` as part of one job: its parent (field 4 of /proc/PID/stat),
    or ``pid`` itself when the parent is init, gone, or a session leader (its session id, field 6,
    is its pid: a login shell, tmux's shell, a systemd service's main process), which starts jobs
    one by one. The ranks of a torchrun (each in a session of its own) or multiprocessing job share
    their launcher; two jobs started from one shell do not. None when /proc does not say."""
    fields = _stat_fields(proc_root, pid)
    try:
        parent = int(fields[4 - 3]) if fields else None
    except (IndexError, ValueError):
        return None
    if parent is None:
        return None
    if parent <= 1:
        return pid
    parent_fields = _stat_fields(proc_root, parent)
    try:
        session = int(parent_fields[6 - 3]) if parent_fields else parent
    except (IndexError, ValueError):
        return pid
    return pid if session == parent else parent


def read_process_info(
    proc_root: Path, pid: int, user_name: Callable[[int], str] = _user_name, cgroup_root: Path | None = None
) -> ProcessInfo | None:
    """Name, user, cgroup place and launcher of ``pid``; None when the process is gone. ``cgroup_root``:
    see ``parse_cgroup_file``."""
    base = proc_root / str(pid)
    comm = _read(base / "comm")
    status = _read(base / "status")
    cgroup = _read(base / "cgroup")
    if comm is None and status is None and cgroup is None:
        return None
    user = None
    for line in (status or "").splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) > 1 and fields[1].isdigit():
                user = user_name(int(fields[1]))
            break
    return ProcessInfo(
        name=comm.strip() or None if comm is not None else None,
        user=user,
        place=parse_cgroup_file(cgroup or "", cgroup_root),
        launcher_pid=launcher_pid(proc_root, pid),
    )


class ProcessEnricher:
    """Adds /proc facts to ProcessSnapshots, with a cache by (pid, starttime).

    One instance lives as long as the poller; ``enrich`` is what the poller calls with
    each GPU's processes. Not thread-safe: call it from the polling thread only.
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        max_entries: int = 4096,
        user_name: Callable[[int], str] = _user_name,
        cgroup_root: Path | None = Path("/sys/fs/cgroup"),
    ) -> None:
        """``cgroup_root``: where the cgroup file systems are mounted; a cgroup directory there that
        root does not own claims no Slurm job, pod or container (``parse_cgroup_path``)."""
        self._proc_root = proc_root
        self._cgroup_root = cgroup_root
        self._max = max_entries
        self._user_name = user_name
        self._cache: OrderedDict[tuple[int, int], ProcessInfo] = OrderedDict()

    def enrich(self, processes: Iterable[ProcessSnapshot]) -> tuple[ProcessSnapshot, ...]:
        """The same processes with name, user, systemd_unit, container_id, pod_uid, slurm_job_id and
        launcher_pid filled where known.

        Fields the backend already filled are kept.
        """
        return tuple(self._one(p) for p in processes)

    def _one(self, process: ProcessSnapshot) -> ProcessSnapshot:
        state, start = state_and_start(self._proc_root, process.pid)
        info = None if start is None else self._info(process.pid, start)
        if info is None:
            return process
        return dataclasses.replace(
            process,
            name=process.name or info.name,
            user=process.user or info.user,
            systemd_unit=process.systemd_unit or info.place.systemd_unit,
            container_id=process.container_id or info.place.container_id,
            pod_uid=process.pod_uid or info.place.pod_uid,
            slurm_job_id=process.slurm_job_id or info.place.slurm_job_id,
            launcher_pid=process.launcher_pid if process.launcher_pid is not None else info.launcher_pid,
            state=process.state or state,  # read every poll (not cached): a process changes state
        )

    def _info(self, pid: int, start: int) -> ProcessInfo | None:
        key = (pid, start)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        info = read_process_info(self._proc_root, pid, self._user_name, self._cgroup_root)
        if info is None:
            return None
        self._cache[key] = info
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return info


def enrich(processes: Iterable[ProcessSnapshot], proc_root: Path = Path("/proc")) -> tuple[ProcessSnapshot, ...]:
    """One-off enrichment without a cache (``gpumon once``); the daemon keeps a ProcessEnricher."""
    return ProcessEnricher(proc_root).enrich(processes)

"""What the user asked ``gpumon burn`` to do, checked all at once (every problem listed)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TESTS = ("sw", "fingerprint", "pcie", "matmul", "memory", "p2p", "allreduce", "pulse")
"""Every test, in run order; ``pulse`` (power steps) runs by default only with ``--long``."""
LONG_ONLY = ("pulse",)
DTYPES = ("auto", "bf16", "fp16", "tf32", "fp32", "fp64")
DEVICES = ("cuda", "cpu")

DEFAULT_DURATION_SECONDS = {("cuda", False): 60.0, ("cuda", True): 6.0, ("cpu", False): 5.0, ("cpu", True): 2.0}
LONG_DURATION_SECONDS = {"cuda": 900.0, "cpu": 10.0}
"""``--long``: seconds of the matmul soak at full power (DCGM's r3 level runs about 15 minutes)."""
DEFAULT_STATE_DIR = "/var/lib/gpumon"
DEFAULT_HEARTBEAT_TIMEOUT_SECONDS = 20.0
DEFAULT_STARTUP_TIMEOUT_SECONDS = 180.0


@dataclass(frozen=True)
class Launch:
    """Where this process sits in a (possibly multi-node) run.

    An *agent* is one ``gpumon burn`` process that spawns one worker per local GPU and
    watches them. ``local``: one agent, all GPUs. ``flags``: one agent per node
    (``--nnodes/--node-rank``). ``slurm``: one agent per node, placed by srun's environment
    (see slurm_launch). ``torchrun``: one agent per torchrun process, one GPU each.
    """

    mode: str
    agent_index: int = 0
    agent_count: int = 1
    node_index: int = 0
    node_count: int = 1
    local_rank: int = 0
    """Index of this agent inside its node (torchrun LOCAL_RANK), 0 otherwise."""
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    store_is_master: bool = True
    run_id: str = "gpumon-burn"
    node_name: str | None = None
    """This node's name for the report (Slurm's SLURMD_NODENAME); None: the host name."""

    @property
    def is_leader(self) -> bool:
        """Agent 0 merges the report and prints the verdict."""
        return self.agent_index == 0

    @property
    def writes_node_state(self) -> bool:
        """One agent per node writes the running marker and last.json."""
        return self.local_rank == 0


@dataclass(frozen=True)
class BurnOptions:
    """A validated ``gpumon burn`` request."""

    gpus: tuple[int, ...]
    """GPU indices on this node, in the backend's (NVML, PCI bus) order."""
    tests: tuple[str, ...]
    duration_seconds: float
    quick: bool
    dtype: str
    json_path: str | None
    force: bool
    device: str
    backend_spec: str
    state_dir: str
    heartbeat_timeout_seconds: float
    startup_timeout_seconds: float
    launch: Launch
    gpus_per_agent: int
    """Workers each agent runs (all node GPUs, or 1 under torchrun)."""
    wide: bool = False
    """``--wide``: the verdict table with a column per test whatever the terminal's width."""
    long: bool = False
    """``--long``: the soak (matmul for LONG_DURATION_SECONDS unless --duration) and the power steps."""

    @property
    def world_size(self) -> int:
        return self.gpus_per_agent * self.launch.agent_count

    @property
    def local_gpus(self) -> tuple[int, ...]:
        """The GPUs this agent's workers use."""
        if self.launch.mode == "torchrun":
            return (self.gpus[self.launch.local_rank],)
        return self.gpus

    @property
    def rank_offset(self) -> int:
        return self.launch.agent_index * self.gpus_per_agent


def split_csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


MAX_GPU_INDEX = 4095
"""Highest GPU index ``--gpus`` accepts before the GPUs are counted (NVML numbers GPUs from 0)."""


_BLANKS = " \t"
"""What may stand around an entry (``0, 1``); str.strip() would also drop control characters like \x1f."""


def parse_gpus(text: str | None, device_count: int | None) -> tuple[tuple[int, ...] | None, list[str]]:
    """``all`` / ``0,1`` -> indices. Range is checked only when ``device_count`` is known.

    Every entry must be an index: ``0,,1`` or a trailing comma is a problem, not a skipped entry."""
    problems: list[str] = []
    if text is None or text.strip(_BLANKS) == "all":
        return (tuple(range(device_count)) if device_count is not None else None), problems
    out: list[int] = []
    parts = [part.strip(_BLANKS) for part in text.split(",")]
    if not text.strip(_BLANKS):
        return (), ["--gpus: no GPU selected (use e.g. 0,1 or all)"]
    if any(not part for part in parts):
        problems.append(f"--gpus: empty entry in {_shown(text)} (use e.g. 0,1 or all)")
    for part in (p for p in parts if p):
        if not (part.isascii() and part.isdigit()) or len(part) > len(str(MAX_GPU_INDEX)):
            problems.append(
                f"--gpus: {_shown(part)} is not a GPU index from 0 to {MAX_GPU_INDEX} (use e.g. 0,1 or all)"
            )
            continue
        index = int(part)
        if index > MAX_GPU_INDEX:
            problems.append(f"--gpus: {index} is not a GPU index from 0 to {MAX_GPU_INDEX}")
            continue
        if index in out:
            problems.append(f"--gpus: GPU {index} given twice")
            continue
        if device_count is not None and index >= device_count:
            problems.append(f"--gpus: GPU {index} does not exist (this host has {device_count}: 0-{device_count - 1})")
            continue
        out.append(index)
    if not out and not problems:
        problems.append("--gpus: no GPU selected")
    return tuple(out), problems


def _shown(text: str) -> str:
    """``text`` quoted for a message, cut to about 60 characters as written (a 4,301-digit argument, or 30
    rare characters that repr writes as ``\\U0002ebe1`` each, stays one readable line)."""
    quoted = repr(text)
    return quoted if len(quoted) <= 60 else quoted[:60] + f"... ({len(text)} characters)"


def parse_tests(text: str | None, long: bool = False) -> tuple[tuple[str, ...], list[str]]:
    """``--tests`` as given (in run order), or every test: those of ``--long`` only with it."""
    if text is None:
        return tuple(t for t in TESTS if long or t not in LONG_ONLY), []
    names = split_csv(text)
    problems = [f"--tests: unknown test {n!r} (one of {','.join(TESTS)})" for n in names if n not in TESTS]
    if not names:
        problems.append("--tests: no test selected")
    return tuple(t for t in TESTS if t in names), problems


def launch_from(
    env: Mapping[str, str], nnodes: int, node_rank: int, master_addr: str | None, master_port: int | None
) -> tuple[Launch, list[str]]:
    """torchrun (RANK/WORLD_SIZE/LOCAL_RANK in env), ``--nnodes`` flags, or a single host."""
    problems: list[str] = []
    if "RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env:
        try:
            rank, world, local = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
            node = int(env.get("GROUP_RANK", "0"))
            nodes = max(1, world // max(1, int(env.get("LOCAL_WORLD_SIZE", "1"))))
            port = int(env.get("MASTER_PORT", "29500"))
        except ValueError:
            return Launch(mode="torchrun"), ["torchrun environment: RANK/WORLD_SIZE/LOCAL_RANK must be integers"]
        agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        return (
            Launch(
                mode="torchrun",
                agent_index=rank,
                agent_count=world,
                node_index=node,
                node_count=nodes,
                local_rank=local,
                master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                master_port=port,
                store_is_master=(rank == 0 and not agent_store),
                run_id="gpumon-burn/"
                + env.get("TORCHELASTIC_RUN_ID", "run")
                + "/"
                + env.get("TORCHELASTIC_RESTART_COUNT", "0"),
            ),
            problems,
        )
    if nnodes < 1:
        problems.append("--nnodes must be at least 1")
    if not 0 <= node_rank < max(nnodes, 1):
        problems.append(f"--node-rank {node_rank} must be between 0 and {max(nnodes, 1) - 1}")
    if nnodes > 1 and (master_addr is None or master_port is None):
        problems.append("--nnodes > 1 needs --master-addr and --master-port (the same on every node)")
    if nnodes <= 1:
        return Launch(mode="local", master_addr=master_addr or "127.0.0.1", master_port=master_port or 0), problems
    return (
        Launch(
            mode="flags",
            agent_index=node_rank,
            agent_count=nnodes,
            node_index=node_rank,
            node_count=nnodes,
            master_addr=master_addr or "127.0.0.1",
            master_port=master_port or 0,
            store_is_master=node_rank == 0,
        ),
        problems,
    )


def default_duration(device: str, quick: bool, long: bool = False) -> float:
    return LONG_DURATION_SECONDS[device] if long else DEFAULT_DURATION_SECONDS[(device, quick)]

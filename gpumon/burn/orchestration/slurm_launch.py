"""A multi-node burn started by Slurm (``srun -N3 gpumon burn ...``): where this agent sits, from
Slurm's environment, with nothing to type.

srun starts one task per node; each task reads:

* ``SLURM_PROCID`` -> agent index (rank 0 merges and prints the fleet report),
* ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``) -> agent count,
* ``SLURM_NODEID`` / ``SLURM_STEP_NUM_NODES`` (else ``SLURM_NNODES``) -> node index / count,
* ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``) -> the first node, whose address
  (``scontrol show hostnames``, then that node's ``NodeAddr``) hosts the rendezvous store,
* ``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` -> the run id and the store's TCP port
  (``20000 + (job * 16 + step) % 10000``: below Linux's ephemeral range, different for steps
  running side by side), unless ``MASTER_PORT`` or ``--master-port`` says otherwise,
* ``SLURMD_NODENAME`` -> the node's name in the report.

``MASTER_ADDR`` / ``--master-addr`` override the address. Only a step of more than one task is a
fleet run; the step must run one task per node (``srun --ntasks-per-node=1``, srun's default
with ``-N`` alone), since one agent drives all of its node's GPUs.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping

from gpumon.burn.orchestration.options import Launch

FIRST_PORT = 20000
PORTS = 10000

Resolver = Callable[[str], str]
"""Slurm node list (``n[1-3]``) -> the first node's address; raises ValueError with the reason."""


def in_slurm_step(env: Mapping[str, str]) -> bool:
    """True when this process is one task of an srun step of more than one task."""
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    return "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and tasks is not None and tasks.strip() not in ("", "1")


def port_for(job_id: int, step_id: int) -> int:
    """The rendezvous port every task of one step computes alike."""
    return FIRST_PORT + (job_id * 16 + step_id) % PORTS


def launch_from_slurm(
    env: Mapping[str, str], master_addr: str | None, master_port: int | None, resolve: Resolver
) -> tuple[Launch, list[str]]:
    """The Launch of this srun task, and the problems that prevent it (each one line)."""
    try:
        rank = int(env["SLURM_PROCID"])
        tasks = int(env.get("SLURM_STEP_NUM_TASKS") or env["SLURM_NTASKS"])
        node = int(env.get("SLURM_NODEID", "0"))
        nodes = int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or tasks)
        job = int(env.get("SLURM_JOB_ID", "0"))
        step_text = env.get("SLURM_STEP_ID", "0")
        step = int(step_text) if step_text.isdigit() else 0
    except (KeyError, ValueError):
        return Launch(mode="slurm"), [
            "Slurm environment: SLURM_PROCID, SLURM_NTASKS, SLURM_NODEID and SLURM_NNODES must be integers"
        ]
    if tasks != nodes:
        return Launch(mode="slurm"), [
            f"srun started {tasks} tasks on {nodes} nodes: gpumon burn runs one task per node and drives all "
            "of its GPUs (srun -N<nodes> --ntasks-per-node=1)"
        ]
    problems: list[str] = []
    port = master_port
    if port is None and env.get("MASTER_PORT", "").isdigit():
        port = int(env["MASTER_PORT"])
    if port is None:
        port = port_for(job, step)
    addr = master_addr or env.get("MASTER_ADDR") or None
    if addr is None:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        try:
            addr = resolve(nodelist)
        except ValueError as exc:
            problems.append(f"cannot find the first node of the Slurm step ({exc}): give --master-addr")
            addr = "127.0.0.1"
    launch = Launch(
        mode="slurm",
        agent_index=rank,
        agent_count=tasks,
        node_index=node,
        node_count=nodes,
        master_addr=addr,
        master_port=port,
        store_is_master=rank == 0,
        run_id=f"gpumon-burn/slurm/{job}.{step}",
        node_name=env.get("SLURMD_NODENAME") or None,
    )
    return launch, problems


def first_node_address(nodelist: str, scontrol: str | None = None, timeout_seconds: float = 20.0) -> str:
    """The address of the first node of a Slurm node list: its NodeAddr (its name when Slurm has none)."""
    if not nodelist.strip():
        raise ValueError("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are empty")
    tool = scontrol or shutil.which("scontrol")
    if tool is None:
        raise ValueError("scontrol not found")
    try:
        names = _run([tool, "show", "hostnames", nodelist], timeout_seconds).split()
        if not names:
            raise ValueError(f"scontrol show hostnames {nodelist} printed nothing")
        first = names[0]
        line = _run([tool, "show", "node", first, "-o"], timeout_seconds)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"scontrol: {exc}") from exc
    for word in line.split():
        key, _, value = word.partition("=")
        if key == "NodeAddr" and value and value != "(null)":
            return value
    return first


def _run(argv: list[str], timeout_seconds: float) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_seconds, check=False)
    if done.returncode != 0:
        raise ValueError(f"{' '.join(argv[1:3])} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout

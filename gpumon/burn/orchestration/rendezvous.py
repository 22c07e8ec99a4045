"""Where the agents of one run meet: the rendezvous store (torch's TCPStore) and the hello every agent sends."""

from __future__ import annotations

import datetime
import importlib
import json
from typing import Any

from gpumon.burn.orchestration.options import BurnOptions
from gpumon.burn.verdict.errors import BurnUsageError, CannotRunError


def open_store(opts: BurnOptions, timeout_seconds: float) -> Any:
    """The rendezvous store: held by this process for a local run, else reached at the launch's master address."""
    dist: Any = importlib.import_module("torch.distributed")

    launch = opts.launch
    timeout = datetime.timedelta(seconds=timeout_seconds)
    try:
        if launch.mode == "local":
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
        else:
            store = dist.TCPStore(
                launch.master_addr,
                launch.master_port,
                is_master=launch.store_is_master,
                wait_for_workers=False,
                timeout=timeout,
            )
    except Exception as exc:
        where = f"{launch.master_addr}:{launch.master_port}"
        raise CannotRunError(f"cannot reach the rendezvous store at {where}: {exc}") from exc
    return store


def meet(agents: Any, opts: BurnOptions, refuse: str | None) -> dict[int, str]:
    """Every agent says hello (its GPU count, or why it refuses) and waits for all the others.

    Returns each node's name (Slurm's node name) when every node has one of its own, else {}."""
    launch = opts.launch
    agents.set(
        f"hello/{launch.agent_index}",
        json.dumps(
            {"gpus": len(opts.local_gpus), "refuse": refuse, "node": launch.node_index, "name": launch.node_name}
        ),
    )
    keys = [f"hello/{i}" for i in range(launch.agent_count)]
    try:
        agents.wait(keys, datetime.timedelta(seconds=opts.startup_timeout_seconds))
    except Exception as exc:
        missing = [k for k in keys if not agents.check([k])]
        raise CannotRunError(
            f"other nodes did not join within {opts.startup_timeout_seconds:.0f} s "
            f"(missing agents {', '.join(k.split('/')[1] for k in missing)}): {exc}"
        ) from exc
    hellos = [json.loads(agents.get(k)) for k in keys]
    refusals = [f"node {h['node']}: {h['refuse']}" for h in hellos if h["refuse"]]
    if refusals:
        raise CannotRunError("; ".join(refusals))
    counts = {h["gpus"] for h in hellos}
    if len(counts) > 1:  # ranks are node x GPUs + local: unequal nodes would share or skip ranks (and hang)
        raise BurnUsageError([f"every node must burn the same number of GPUs (got {sorted(counts)})"])
    names = {int(h["node"]): h.get("name") for h in hellos}
    if all(names.values()) and len(set(names.values())) == len(names):
        return {node: str(name) for node, name in names.items()}
    return {}

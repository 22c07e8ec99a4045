"""A real multi-node Slurm cluster on one machine, for tests: slurmctld + 3 slurmd nodes + munge.

Layout (/work/shared/slurm-cluster.md): slurmctld runs in the root network namespace on a bridge
at 198.18.X.1 (X chosen per run, so two runs at once do not collide); node ``nI`` runs its slurmd
in a network namespace of its own at 198.18.X.1I. Each node also runs its own gpumon daemon
(``gpumon run`` on simulated GPUs, ``--backend fake:SCENARIO``) as a non-root service user made for
this run (as the shipped unit's DynamicUser), with its own config and state directory, listening
on 0.0.0.0:10480 inside its namespace.

Slurm itself runs gpumon on every node: ``HealthCheckProgram`` (every ``HEALTH_INTERVAL_SECONDS``,
on all nodes at once, ``HealthCheckNodeState=ANY``), ``Prolog`` and ``Epilog``. One script serves
every node (slurm.conf names one program); it finds its node from the address of its namespace
(slurmd passes no SLURM_CONF) and runs ``BASE/nI/<hook>``, which calls ``gpumon health`` with the
node's config, state directory and SLURM_CONF. A hook does nothing until a test turns it on
(:meth:`Fleet.enable`), so the cluster starts quiet. Each finished run appends a line
``<exit code> <time>`` to ``BASE/nI/<hook>.runs``.

Names made system-wide carry the pid of the test process: namespaces ``gpmf<pid>n<I>``, bridge
``gpmb<pid>``, veths ``gpmv<pid>n<I>`` (at most 15 characters), user ``gpmf<pid>``, directory
``/tmp/gpmf<pid>-*``. :func:`start` first removes what a run whose process is gone left behind;
:func:`stop` removes everything this run made, whatever state it is in.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from gpumon.state.burn_record import pid_alive
from tests.health.slurm_cluster import BINARIES, common_conf, start_munge, stop_pidfiles
from tests.helpers import REPO, wait_for

NODES = ("n1", "n2", "n3")
PARTITION = "gpu"
DAEMON_PORT = 10480
HEALTH_INTERVAL_SECONDS = 5
HOOKS = ("health", "prolog", "epilog")
PREFIX = "gpmf"
_EXTRA_BINARIES = ("ip", "nsenter", "setpriv", "useradd", "userdel")


def missing_reason() -> str | None:
    """Why the cluster cannot start here, or None."""
    missing = [b for b in (*BINARIES, *_EXTRA_BINARIES) if shutil.which(b) is None]
    if missing:
        return f"binaries missing for the multi-node Slurm cluster: {', '.join(missing)}"
    if os.geteuid() != 0:
        return "the multi-node Slurm cluster needs root (network namespaces, slurmd as root)"
    probe = f"gpmp{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a network namespace here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Node:
    name: str
    index: int
    netns: str
    address: str
    dir: Path
    daemon: subprocess.Popen[bytes] | None = None
    scenario: str = "healthy"
    kmsg: Path | None = None
    """When set, the daemon runs ``--backend nvml`` on a fake NVML (tests/health/nvml_node.py) and follows
    this file as its kernel log (``kernel_log: true``), keeping the node's own health state; else it
    runs ``--backend fake:SCENARIO``."""
    nvml_init_delay_seconds: float = 0.0
    """With ``kmsg``: how long the fake NVML's init takes (the kernel-log backfill comes first)."""

    def set_hook_args(self, hook: str, *args: str) -> None:
        """More words for this node's ``gpumon health`` in ``hook`` (after the harness's own), e.g.
        ``--daemon-url URL``; none removes them."""
        path = self.dir / f"{hook}.args"
        if args:
            path.write_text(" ".join(args) + "\n")
        else:
            path.unlink(missing_ok=True)

    @property
    def config(self) -> Path:
        return self.dir / "gpumon.yaml"

    @property
    def state(self) -> Path:
        return self.dir / "state"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{DAEMON_PORT}"

    def runs(self, hook: str = "health") -> list[tuple[int, float]]:
        """(exit code, end time) of each finished run of a hook on this node."""
        path = self.dir / f"{hook}.runs"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            code, _, at = line.partition(" ")
            with contextlib.suppress(ValueError):
                out.append((int(code), float(at)))
        return out

    def actions(self) -> list[dict[str, Any]]:
        path = self.state / "health" / "actions.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Fleet:
    base: Path
    conf: Path
    run_id: str
    bridge: str
    user: str
    uid: int
    gid: int
    nodes: dict[str, Node] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)
    """health.slurm settings every node's gpumon.yaml gets (tests may change them, then write_configs)."""
    extra_config: dict[str, Any] = field(default_factory=dict)
    """More top-level gpumon.yaml sections for every node (e.g. alerting), as YAML-able data;
    ``{node}`` in a string value becomes the node's name."""

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(args), capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {done.stderr or done.stdout}")
        return done

    # ---- Slurm's view -------------------------------------------------------------------------
    def node_info(self) -> dict[str, dict[str, Any]]:
        """Every node as ``sinfo --json`` reports it, by name."""
        data = json.loads(self.run("sinfo", "--json").stdout)
        return {n["name"]: n for n in data["nodes"]}

    def drained(self) -> set[str]:
        return {name for name, n in self.node_info().items() if "DRAIN" in flags(n)}

    def unusable(self) -> set[str]:
        """Nodes that cannot take work: drained, down, failed or not responding."""
        bad = {"DRAIN", "DOWN", "FAIL", "NOT_RESPONDING"}
        return {name for name, n in self.node_info().items() if flags(n) & bad}

    def drain(self, name: str, reason: str) -> None:
        self.run("scontrol", "update", f"nodename={name}", "state=drain", f"reason={reason}")

    def stop_slurmd(self, name: str) -> None:
        """Node ``name``'s slurmd stops (the node dies); mark it DOWN with ``scontrol update`` to see it now."""
        stop_pidfiles([self.base / f"slurmd.{name}.pid"])
        (self.base / f"slurmd.{name}.pid").unlink(missing_ok=True)

    def start_slurmd(self, name: str) -> None:
        node = self.nodes[name]
        _sh_env(["nsenter", f"--net=/run/netns/{node.netns}", "slurmd", "-f", str(self.conf), "-N", name], self.env)

    def resume_all(self) -> None:
        """Every node undrained and up (also DOWN ones, their slurmd started again), then wait until all are idle."""
        for name in self.nodes:
            if not (self.base / f"slurmd.{name}.pid").exists():
                self.start_slurmd(name)
        for name, n in self.node_info().items():
            if flags(n) & {"DRAIN", "DOWN", "FAIL"}:
                self.run("scontrol", "update", f"nodename={name}", "state=resume", check=False)
        wait_for(lambda: not self.unusable(), 30, 0.2, "every node back in service")

    # ---- hooks -----------------------------------------------------------------------------------
    def enable(self, *hooks: str) -> None:
        for hook in hooks:
            (self.base / f"{hook}.on").touch()

    def disable(self, *hooks: str) -> None:
        for hook in hooks or HOOKS:
            (self.base / f"{hook}.on").unlink(missing_ok=True)

    def idle(self) -> bool:
        """No hook is running on any node now."""
        return not any((node.dir / f"{hook}.running").exists() for node in self.nodes.values() for hook in HOOKS)

    def set_delay(self, seconds: float, most_seconds: float | None = None) -> None:
        """Every scontrol / sinfo call gpumon makes waits this long first (a slow controller); with
        ``most_seconds``, a random time from ``seconds`` to ``most_seconds``, drawn for each call
        (each drawn wait is appended to ``bin/delays``: :meth:`delays`)."""
        text = f"{seconds}" if most_seconds is None else f"{seconds}-{most_seconds}"
        (self.base / "bin" / "delay").write_text(f"{text}\n")

    def delays(self) -> list[float]:
        """The waits the slow-controller wrappers drew so far (random delays only)."""
        path = self.base / "bin" / "delays"
        return [float(x) for x in path.read_text().split()] if path.exists() else []

    # ---- gpumon daemons -----------------------------------------------------------------------------
    def write_configs(self) -> None:
        for node in self.nodes.values():
            _write_gpumon_config(self, node)

    def start_daemon(self, name: str, scenario: str | None = None, *, fresh_state: bool = False) -> Node:
        """(Re)start node ``name``'s gpumon daemon as the service user; wait until it answers."""
        self._launch_daemon(name, scenario, fresh_state=fresh_state)
        return self._wait_daemon(name)

    def _launch_daemon(self, name: str, scenario: str | None = None, *, fresh_state: bool = False) -> None:
        node = self.nodes[name]
        self.stop_daemon(name)
        if scenario is not None:
            node.scenario = scenario
        if fresh_state:
            shutil.rmtree(node.state, ignore_errors=True)
        node.state.mkdir(mode=0o700, exist_ok=True)
        _chown_tree(node.state, self.uid, self.gid)
        _write_gpumon_config(self, node)
        log = (node.dir / "gpumon.log").open("ab")
        node.daemon = subprocess.Popen(
            [
                "nsenter",
                f"--net=/run/netns/{node.netns}",
                "--",
                *_reachable_python(self.base),
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--clear-groups",
                "--",
                "env",
                "-i",
                f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}",
                f"PYTHONPATH={REPO}",
                "PYTHONUNBUFFERED=1",
                "HOME=/nonexistent",
                sys.executable,
                "-m",
                *_daemon_command(node),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def _wait_daemon(self, name: str) -> Node:
        node = self.nodes[name]

        def answers() -> bool:
            if node.daemon is not None and node.daemon.poll() is not None:
                tail = (node.dir / "gpumon.log").read_text()[-2000:]
                raise AssertionError(f"gpumon daemon on {name} exited {node.daemon.returncode}:\n{tail}")
            with contextlib.suppress(requests.RequestException):
                return requests.get(f"{node.url}/api/health", timeout=2).status_code == 200
            return False

        wait_for(answers, 60, 0.2, f"gpumon daemon on {name}")
        return node

    def verdict(self, name: str) -> dict[str, Any]:
        return dict(requests.get(f"{self.nodes[name].url}/api/health", timeout=5).json())

    def stop_daemon(self, name: str) -> None:
        node = self.nodes[name]
        if node.daemon is None:
            return
        with contextlib.suppress(ProcessLookupError):
            node.daemon.send_signal(signal.SIGTERM)
        try:
            node.daemon.wait(10)
        except subprocess.TimeoutExpired:
            node.daemon.kill()
            node.daemon.wait(5)
        node.daemon = None

    def round(self, *names: str, hook: str = "health", timeout: float = 60) -> None:
        """Turn ``hook`` on until Slurm ran it to the end on every node named (default: all), then off
        and wait until no hook runs."""
        names = names or tuple(self.nodes)
        before = {n: len(self.nodes[n].runs(hook)) for n in names}
        self.enable(hook)
        try:
            wait_for(
                lambda: all(len(self.nodes[n].runs(hook)) > before[n] for n in names),
                timeout,
                0.1,
                f"Slurm to run the {hook} hook on {', '.join(names)}",
            )
        finally:
            self.disable(hook)
            wait_for(self.idle, 60, 0.1, "the running hooks to finish")

    def scenario_file(self, name: str, text: str) -> str:
        """A scenario file the service user can read; its path for ``start_daemon``."""
        path = self.base / "scenarios" / f"{name}.yaml"
        path.parent.mkdir(mode=0o755, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
        return f"fake:{path}"

    def prepare(self, scenarios: Mapping[str, str], **slurm: Any) -> None:
        """Every node's daemon restarted on its scenario (default healthy) with a fresh state
        directory, and health.slurm settings ``slurm`` (over the harness's own) in every config."""
        self.slurm = {k: v for k, v in self.slurm.items() if k in ("scontrol", "sinfo")} | slurm
        for node in self.nodes.values():  # stopped, started side by side, then each waited for
            if node.daemon is not None:
                with contextlib.suppress(ProcessLookupError):
                    node.daemon.send_signal(signal.SIGTERM)
        for name in self.nodes:
            self._launch_daemon(name, scenarios.get(name, "healthy"), fresh_state=True)
        for name in self.nodes:
            self._wait_daemon(name)

    def reset(self) -> None:
        """Hooks off and idle, no scontrol delay, every node in service, drain records gone."""
        self.disable()
        wait_for(self.idle, 60, 0.1, "the running hooks to finish")
        self.set_delay(0)
        self.resume_all()
        for node in self.nodes.values():
            for hook in HOOKS:
                (node.dir / f"{hook}.runs").unlink(missing_ok=True)


def flags(node: Mapping[str, Any]) -> set[str]:
    """State and flags of a sinfo --json node as upper-case words (22.05: state + state_flags)."""
    state = node.get("state", "")
    words = set(state) if isinstance(state, list) else {str(state)}
    words |= set(node.get("state_flags") or [])
    return {w.upper() for w in words}


def _reachable_python(base: Path) -> list[str]:
    """A prefix that lets the service user run this interpreter.

    When it lives under /root (mode 0700, e.g. pyenv), the daemon gets a mount namespace of its own
    in which /root is a tmpfs holding only a bind mount of the interpreter's tree at the same path
    (nothing changes outside that namespace). Elsewhere: nothing."""
    real = Path(os.path.realpath(sys.executable))
    if real.parts[:2] != ("/", "root") or len(real.parts) < 4:
        return []
    tree = Path(*real.parts[:3])  # /root/.pyenv
    keep = base / "python-tree"
    keep.mkdir(exist_ok=True)
    script = (
        f"mount --bind {tree} {keep} && mount -t tmpfs -o mode=0755 tmpfs /root && mkdir {tree} "
        f'&& mount --bind {keep} {tree} && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"]


def _daemon_command(node: Node) -> list[str]:
    """What follows ``python -m`` to run node's daemon."""
    run = ["run", "--config", str(node.config), "--backend", _node_backend(node)]
    if node.kmsg is None:
        return ["gpumon", *run]
    return ["tests.health.nvml_node", str(node.kmsg), str(node.nvml_init_delay_seconds), "--", *run]


def _node_backend(node: Node) -> str:
    return "nvml" if node.kmsg is not None else _backend(node.scenario)


def _backend(scenario: str) -> str:
    return scenario if scenario.startswith("fake") else f"fake:{scenario}"


def _write_gpumon_config(fleet: Fleet, node: Node) -> None:
    slurm = {"enabled": True, "node_name": node.name, "partition": PARTITION, **fleet.slurm}
    lines = "\n".join(f"    {k}: {json.dumps(v)}" for k, v in slurm.items())
    node.config.write_text(
        f"""listen: 0.0.0.0:{DAEMON_PORT}
backend: {json.dumps(_node_backend(node))}
state_dir: {node.state}
kernel_log: {"true" if node.kmsg is not None else "false"}
health:
  slurm:
{lines}
"""
        + "".join(f"{key}: {json.dumps(_per_node(value, node.name))}\n" for key, value in fleet.extra_config.items())
    )
    node.config.chmod(0o644)


def _per_node(value: Any, name: str) -> Any:
    if isinstance(value, str):
        return value.replace("{node}", name)
    if isinstance(value, dict):
        return {k: _per_node(v, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_per_node(v, name) for v in value]
    return value


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    for root, dirs, files in os.walk(path):
        os.chown(root, uid, gid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed: {done.stderr.strip()}")
    return done


def remove_leftovers() -> None:
    """Remove what an earlier run of this harness left behind (only runs whose process is gone)."""
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}(\d+)n\d+", name)
        if m and not pid_alive(int(m.group(1))):
            for pid in _sh("ip", "netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _sh("ip", "netns", "del", name, check=False)
    for line in _sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        m = re.match(r"\d+: (gpm[bv](\d+)(?:n\d+)?)[@:]", line)
        if m and not pid_alive(int(m.group(2))):
            _sh("ip", "link", "del", m.group(1), check=False)
    with open("/etc/passwd") as passwd:
        users = [line.split(":")[0] for line in passwd]
    for user in users:
        m = re.fullmatch(rf"{PREFIX}(\d+)", user)
        if m and not pid_alive(int(m.group(1))):
            _passwd("userdel", user)
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        m = re.match(rf"{PREFIX}(\d+)-", path.name)
        if m and not pid_alive(int(m.group(1))):
            for pidfile in path.glob("**/*.pid"):
                stop_pidfiles([pidfile])
            shutil.rmtree(path, ignore_errors=True)


def _free_subnet() -> int:
    """X such that no address of this machine lies in 198.18.X.0/24."""
    used = set(re.findall(r"inet 198\.18\.(\d+)\.", _sh("ip", "-o", "-4", "addr", "show").stdout))
    first = os.getpid() % 250 + 1
    for x in [*range(first, 255), *range(1, first)]:
        if str(x) not in used:
            return x
    raise AssertionError("no free /24 in 198.18.0.0/16 for the test cluster")


def _ctld_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def start(nodes: tuple[str, ...] = NODES) -> Fleet:
    """Build the cluster of ``nodes`` (at most 9); on any failure everything made so far is removed
    before raising."""
    remove_leftovers()
    pid = os.getpid()
    run_id = str(pid)
    base = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-"))
    base.chmod(0o755)  # the service user reaches its node's directory
    user = f"{PREFIX}{pid}"
    fleet = Fleet(base=base, conf=base / "slurm.conf", run_id=run_id, bridge=f"gpmb{pid}", user=user, uid=-1, gid=-1)
    try:
        _build(fleet, nodes)
    except BaseException:
        stop(fleet)
        raise
    return fleet


def _build(fleet: Fleet, names: tuple[str, ...]) -> None:
    pid, base = fleet.run_id, fleet.base
    _passwd(
        "useradd",
        "--system",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin",
        fleet.user,
    )
    entry = _sh("id", "-u", fleet.user).stdout.strip(), _sh("id", "-g", fleet.user).stdout.strip()
    fleet.uid, fleet.gid = int(entry[0]), int(entry[1])

    x = _free_subnet()
    ctld_addr = f"198.18.{x}.1"
    _sh("ip", "link", "add", fleet.bridge, "type", "bridge")
    _sh("ip", "addr", "add", f"{ctld_addr}/24", "dev", fleet.bridge)
    _sh("ip", "link", "set", fleet.bridge, "up")
    for i, name in enumerate(names, start=1):
        netns, veth = f"{PREFIX}{pid}n{i}", f"gpmv{pid}n{i}"
        node = Node(name=name, index=i, netns=netns, address=f"198.18.{x}.1{i}", dir=base / name)
        fleet.nodes[name] = node
        _sh("ip", "netns", "add", netns)
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _sh("ip", "link", "set", veth, "master", fleet.bridge, "up")
        _sh("ip", "netns", "exec", netns, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
        _sh("ip", "netns", "exec", netns, "ip", "link", "set", "eth0", "up")
        _sh("ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up")
        node.dir.mkdir(mode=0o755)

    sock = start_munge(base)
    _write_scripts(fleet)
    for sub in ("ctld-state", "log"):
        (base / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    node_lines = "\n".join(f"NodeName={n.name} NodeAddr={n.address} CPUs=1 State=UNKNOWN" for n in fleet.nodes.values())
    fleet.conf.write_text(
        f"""ClusterName=gpmfleet
SlurmctldHost={host}({ctld_addr})
SlurmctldPort={_ctld_port()}
SlurmdPort=6818
{common_conf(sock)}StateSaveLocation={base / "ctld-state"}
SlurmdSpoolDir={base / "spool.%n"}
SlurmctldPidFile={base / "slurmctld.pid"}
SlurmdPidFile={base / "slurmd.%n.pid"}
SlurmdLogFile={base / "log" / "slurmd.%n.log"}
SlurmctldLogFile={base / "log" / "slurmctld.log"}
HealthCheckProgram={base / "bin" / "hook"}
HealthCheckInterval={HEALTH_INTERVAL_SECONDS}
HealthCheckNodeState=ANY
Prolog={base / "bin" / "prolog"}
Epilog={base / "bin" / "epilog"}
PrologFlags=Alloc
SlurmdTimeout=300
MessageTimeout=10
{node_lines}
PartitionName={PARTITION} Nodes={",".join(names)} Default=YES MaxTime=INFINITE State=UP
"""
    )
    env = fleet.env
    _sh_env(["slurmctld", "-f", str(fleet.conf), "-i"], env)
    for node in fleet.nodes.values():
        _sh_env(["nsenter", f"--net=/run/netns/{node.netns}", "slurmd", "-f", str(fleet.conf), "-N", node.name], env)

    def all_idle() -> bool:
        for daemon in ["slurmctld", *(f"slurmd.{n}" for n in names)]:
            pidfile = base / f"{daemon}.pid"
            text = pidfile.read_text().strip() if pidfile.exists() else ""
            if text and not pid_alive(int(text.split()[0])):
                log = base / "log" / (daemon + ".log")
                raise AssertionError(f"{daemon} exited:\n{log.read_text()[-2000:] if log.exists() else ''}")
        info = json.loads(fleet.run("sinfo", "--json", check=False).stdout or "{}")
        nodes = info.get("nodes") or []
        return len(nodes) == len(names) and all(flags(n) == {"IDLE"} for n in nodes)

    wait_for(all_idle, 60, 0.3, f"slurmd on {', '.join(names)} to register as idle")
    fleet.set_delay(0)
    for name in names:
        fleet._launch_daemon(name)
    for name in names:
        fleet._wait_daemon(name)


def _passwd(*args: str) -> None:
    """useradd / userdel, again for a few seconds while another run holds /etc/passwd's lock."""
    for _ in range(20):
        done = subprocess.run(list(args), capture_output=True, text=True)
        if done.returncode not in (1, 10):  # 1, 10: cannot update (or lock) the password or group file
            return
        time.sleep(0.25)


def _sh_env(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed: {done.stderr.strip()}")


def _write_scripts(fleet: Fleet) -> None:
    """bin/hook, bin/prolog, bin/epilog (one for all nodes) -> nI/<hook>; slow scontrol/sinfo wrappers."""
    base, bindir = fleet.base, fleet.base / "bin"
    bindir.mkdir()
    cases = " ".join(f"{n.address}) node={n.name};;" for n in fleet.nodes.values())
    for hook in HOOKS:
        script = bindir / ("hook" if hook == "health" else hook)
        script.write_text(
            f"""#!/bin/sh
# Slurm's {hook} for every node: the node is found by its namespace's address.
node=""
for a in $(ip -o -4 addr show dev eth0 2>/dev/null | awk '{{print $4}}' | cut -d/ -f1); do
  case $a in {cases} esac
done
[ -n "$node" ] && [ -f {base}/{hook}.on ] || exit 0
exec {base}/$node/{hook}
"""
        )
        script.chmod(0o755)
    mode = {"health": "--slurm", "prolog": "--slurm-prolog", "epilog": "--slurm-epilog"}
    for node in fleet.nodes.values():
        for hook in HOOKS:
            script = node.dir / hook
            script.write_text(
                f"""#!/bin/sh
# {node.name}'s {hook}: gpumon with this node's config, state and SLURM_CONF (slurmd passes none).
touch {node.dir}/{hook}.running
SLURM_CONF={fleet.conf} PYTHONPATH={REPO} {sys.executable} -m gpumon health {mode[hook]} \\
  --config {node.config} --state-dir {node.state} $(cat {node.dir}/{hook}.args 2>/dev/null) \\
  >> {node.dir}/{hook}.log 2>&1
rc=$?
echo "$rc $(date +%s.%N)" >> {node.dir}/{hook}.runs
rm -f {node.dir}/{hook}.running
exit $rc
"""
            )
            script.chmod(0o755)
    for tool in ("scontrol", "sinfo"):
        wrapper = bindir / tool
        wrapper.write_text(
            f"""#!/bin/sh
# A controller that answers slowly: wait $(cat delay) seconds, then the real {tool}; a delay
# LO-HI waits a random time from LO to HI seconds (drawn from /dev/urandom, logged in delays).
d=$(cat {bindir}/delay 2>/dev/null || echo 0)
case $d in
  *-*) r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
       d=$(awk -v lo="${{d%-*}}" -v hi="${{d#*-}}" -v r="$r" 'BEGIN {{ printf "%.3f", lo + (hi - lo) * r / 65535 }}')
       echo "$d" >> {bindir}/delays;;
esac
sleep "$d"
exec {shutil.which(tool)} "$@"
"""
        )
        wrapper.chmod(0o755)
    fleet.slurm = {"scontrol": str(bindir / "scontrol"), "sinfo": str(bindir / "sinfo")}


def stop(fleet: Fleet) -> None:
    """Stop every daemon by its pid and remove namespaces, bridge, user and directory (never raises)."""
    for node in fleet.nodes.values():  # all at once: each then takes its ~1 s to stop side by side
        with contextlib.suppress(Exception):
            if node.daemon is not None:
                node.daemon.send_signal(signal.SIGTERM)
    for name in list(fleet.nodes):
        with contextlib.suppress(Exception):
            fleet.stop_daemon(name)
    base = fleet.base
    with contextlib.suppress(Exception):
        stop_pidfiles([*(base / f"slurmd.{n}.pid" for n in fleet.nodes), base / "slurmctld.pid", base / "munged.pid"])
    for node in fleet.nodes.values():
        for pid in _sh("ip", "netns", "pids", node.netns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _sh("ip", "netns", "del", node.netns, check=False)
        _sh("ip", "link", "del", f"gpmv{fleet.run_id}n{node.index}", check=False)
    _sh("ip", "link", "del", fleet.bridge, check=False)
    if fleet.user:
        _passwd("userdel", fleet.user)
    shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def fleet_running() -> Iterator[Fleet]:
    fleet = start()
    try:
        yield fleet
    finally:
        stop(fleet)


def fleet_fixture() -> Iterator[Fleet]:
    """For a module-scoped fixture: ``fleet = pytest.fixture(scope="module")(slurm_nodes.fleet_fixture)``."""
    import pytest

    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with fleet_running() as fleet:
        yield fleet

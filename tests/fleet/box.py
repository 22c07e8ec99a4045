"""A fleet in a box: the Slurm cluster of the Slurm tests (tests/health/slurm_nodes.py) plus a
Prometheus and an Alertmanager HA pair, on one machine. ``make cluster`` / ``make cluster-down``
run this module; tests/fleet/test_fleet_box.py uses :func:`start_box` / :func:`stop_box`.

* N nodes (default 3, at most 9) in network namespaces, each with slurmd and a gpumon daemon on
  simulated GPUs playing a named scenario (:data:`SCENARIOS`); slurmctld in the root namespace;
  Slurm runs ``gpumon health --slurm`` on every node as its HealthCheckProgram (every 5 s).
* Prometheus on 127.0.0.1 scrapes every node's daemon (label ``node``) with gpumon's recording
  and alerting rules (prometheus/), and sends its alerts to both Alertmanagers.
* Two Alertmanagers clustered as an HA pair (``--cluster.listen-address`` / ``--cluster.peer``) on
  the bridge address, which the nodes reach: every gpumon daemon sends its own alerts to both.

Everything made carries the pid of the process that keeps the box (names ``gpmf<pid>...``,
directory ``/tmp/gpmf<pid>-*``): when that process is gone, the next start of the box or of the
Slurm tests removes what it left.

    python -m tests.fleet.box up [--nodes N]   # prints where to look; the keeper stays in the background
    python -m tests.fleet.box down             # stops the keeper, which removes everything
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from gpumon.state.burn_record import pid_alive
from tests.health import slurm_nodes
from tests.helpers import REPO, free_port, wait_for

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
STATE_FILE = Path("/run/gpumon-fleet-box.json")
KEEPER_LOG = STATE_FILE.with_name("gpumon-fleet-box.log")
"""What the keeper writes while the box is up; make cluster-down removes it."""
RULE_FILES = (REPO / "prometheus" / "gpumon-recording.rules.yml", REPO / "prometheus" / "gpumon-alerts.rules.yml")

SCENARIOS = ("healthy-job", "gpu-lost", "straggler", "xid-storm", "overheating", "nvlink-degraded", "healthy")
"""Node nI plays SCENARIOS[I-1] (node 1: healthy, running Slurm job 1001; node 2: XID 79, its GPU 1
falls off the bus; node 3: a straggler)."""
JOB_ID = "1001"
JOB_POWER_WATTS = 612.5
"""Each GPU of node 1 draws this much for Slurm job 1001 (its energy counter rises by it every second)."""

SHOWS = {
    "healthy-job": f"OK, no alert; Slurm job {JOB_ID} on both GPUs: energy and cost per job on the dashboard",
    "healthy": "OK, no alert, stays in service",
    "gpu-lost": "XID 79 on GPU 1 at the 5th poll: CRITICAL, GpuLost/GpuXidCritical alerts, drained by Slurm",
    "straggler": "GPU 2 at reduced clocks (HW slowdown): a straggler on the dashboard, GpuHwSlowdown, stays in service",
    "xid-storm": "XID 13 every poll, then XID 48 (double-bit ECC): CRITICAL, XID alerts, drained if the breaker allows",
    "overheating": "GPU 0 past its slowdown temperature: WARNING, thermal slowdown alerts, stays in service",
    "nvlink-degraded": "NVLink 3 of GPUs 0 and 1 down: NVLink alerts",
}
MAX_DRAINED_SHARE = 0.5
DRAINED_SCENARIOS = ("gpu-lost", "xid-storm")
"""Scenarios whose node gpumon drains on purpose (the breaker allowing): a job asking for it waits."""


def job_scenario() -> str:
    """The ``healthy`` scenario with its training job in Slurm job JOB_ID and energy counters that
    rise by JOB_POWER_WATTS a second (one tick a second, for an hour; from 0, so the job's joules
    equal the counters)."""
    raw = yaml.safe_load((REPO / "gpumon" / "backends" / "scenarios" / "healthy.yaml").read_text())
    raw["base"]["processes"] = [{**p, "slurm_job_id": JOB_ID} for p in raw["base"]["processes"]]
    raw["base"]["energy_joules_total"] = [round(JOB_POWER_WATTS * t, 1) for t in range(3600)]
    return "# healthy, running Slurm job " + JOB_ID + " (tests/fleet/box.py)\n" + yaml.safe_dump(raw)


def missing_reason() -> str | None:
    """Why the box cannot start here, or None."""
    reason = slurm_nodes.missing_reason()
    if reason is not None:
        return reason
    if PROMETHEUS is None or ALERTMANAGER is None:
        return "prometheus and prometheus-alertmanager are needed (Debian packages of those names)"
    return None


@dataclass
class Server:
    """A Prometheus or Alertmanager this box started (stopped by its pid file)."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    cluster_address: str = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@dataclass
class Box:
    fleet: slurm_nodes.Fleet
    scenarios: dict[str, str]
    prometheus: Server | None = None
    alertmanagers: list[Server] = field(default_factory=list)

    @property
    def bridge_address(self) -> str:
        first = next(iter(self.fleet.nodes.values())).address
        return first.rsplit(".", 1)[0] + ".1"

    def query(self, expr: str) -> list[Any]:
        assert self.prometheus is not None
        body = requests.get(f"{self.prometheus.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        if body.get("status") != "success":
            raise AssertionError(f"{expr}: {body.get('error')}")
        return list(body["data"]["result"])

    def am_alerts(self, am: Server, **filters: str) -> list[dict[str, Any]]:
        """The alerts Alertmanager ``am`` holds now (``/api/v2/alerts``), those with every label in ``filters``."""
        alerts = requests.get(f"{am.url}/api/v2/alerts", timeout=5).json()
        return [a for a in alerts if all(a["labels"].get(k) == v for k, v in filters.items())]

    def _srun_lines(self) -> list[str]:
        """A fleet burn on the nodes that stay in service (a drained node would keep srun waiting)."""
        serving = [n for n in self.fleet.nodes if self.scenarios[n] not in DRAINED_SCENARIOS]
        drained = [n for n in self.fleet.nodes if n not in serving]
        lines = [
            f"  srun -N{len(serving)} -w {','.join(serving)} {sys.executable} -m gpumon burn --device cpu"
            " --backend fake --gpus 0 --tests matmul,allreduce --duration 3 --state-dir /tmp/burn-state"
            "   # a fleet burn, one report"
        ]
        if drained:
            lines.append(
                f"    ({', '.join(drained)}: drained on purpose by gpumon's health check, so not in the srun:"
                f" srun -N{len(self.fleet.nodes)} would wait for it, 'Required node not available')"
            )
        return lines if serving else []

    def guide(self) -> str:
        """Where to look and what each node should show."""
        fleet = self.fleet
        lines = [
            f"gpumon fleet box: {len(fleet.nodes)} nodes (keeper pid {fleet.run_id}, files in {fleet.base})",
            f"  export SLURM_CONF={fleet.conf}",
            "  sinfo -N -o '%N %T %E'          # Slurm's view (gpumon drains through its health check)",
            *self._srun_lines(),
        ]
        if self.prometheus is not None:
            lines.append(f"  Prometheus:    {self.prometheus.url}  (alerts: {self.prometheus.url}/alerts)")
        for i, am in enumerate(self.alertmanagers, start=1):
            lines.append(f"  Alertmanager {i}: {am.url}  (cluster {am.cluster_address})")
        lines.append("  nodes:")
        for name, node in fleet.nodes.items():
            scenario = self.scenarios[name]
            lines.append(
                f"    {name} {node.url:28} {scenario:16} {SHOWS.get(scenario, '')}\n"
                f"       shell: nsenter --net=/run/netns/{node.netns} bash   log: {node.dir / 'gpumon.log'}"
            )
        lines.append("  stop: make cluster-down")
        return "\n".join(lines)


def _start_server(name: str, argv: list[str], url: str, directory: Path, cluster_address: str = "") -> Server:
    log_path = directory / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (directory / f"{name}.pid").write_text(f"{proc.pid}\n")
    server = Server(name, url, proc, log_path, cluster_address)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}:\n{server.log()}")
        with contextlib.suppress(requests.RequestException):
            return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
        return False

    wait_for(ready, 60, 0.1, f"{name} /-/ready")
    return server


def _start_alertmanagers(box: Box, webhook_url: str | None) -> None:
    assert ALERTMANAGER is not None
    addr, base = box.bridge_address, box.fleet.base
    web = [free_port(addr) for _ in range(2)]
    gossip = [free_port(addr) for _ in range(2)]
    receiver: dict[str, Any] = {"name": "fleet"}
    if webhook_url:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": False}]
    config = {
        "route": {
            "receiver": "fleet",
            "group_by": ["alertname", "node", "host"],
            "group_wait": "1s",
            "group_interval": "5s",
            "repeat_interval": "4h",
        },
        "receivers": [receiver],
    }
    for i in range(2):
        directory = base / f"alertmanager-{i + 1}"
        directory.mkdir()
        (directory / "alertmanager.yml").write_text(yaml.safe_dump(config))
        argv = [
            ALERTMANAGER,
            f"--config.file={directory / 'alertmanager.yml'}",
            f"--storage.path={directory / 'data'}",
            f"--web.listen-address={addr}:{web[i]}",
            f"--web.external-url=http://{addr}:{web[i]}",
            f"--cluster.listen-address={addr}:{gossip[i]}",
            f"--cluster.advertise-address={addr}:{gossip[i]}",
            f"--cluster.peer={addr}:{gossip[1 - i]}",
            "--cluster.peer-timeout=5s",
            "--log.level=warn",
        ]
        box.alertmanagers.append(
            _start_server(f"alertmanager-{i + 1}", argv, f"http://{addr}:{web[i]}", base, f"{addr}:{gossip[i]}")
        )

    def paired() -> bool:
        for am in box.alertmanagers:
            status = requests.get(f"{am.url}/api/v2/status", timeout=5).json()
            peers = (status.get("cluster") or {}).get("peers") or []
            if status.get("cluster", {}).get("status") != "ready" or len(peers) != 2:
                return False
        return True

    wait_for(paired, 60, 0.2, "the two Alertmanagers to form a cluster")


def prometheus_config(box: Box, scrape_interval: str = "2s") -> dict[str, Any]:
    """Prometheus scraping every node (label ``node``) with gpumon's rules, alerting both Alertmanagers."""
    return {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval, "evaluation_interval": "2s"},
        "rule_files": [str(p) for p in RULE_FILES],
        "alerting": {
            "alertmanagers": [
                {"static_configs": [{"targets": [am.url.removeprefix("http://") for am in box.alertmanagers]}]}
            ]
        },
        "scrape_configs": [
            {
                "job_name": "gpumon",
                "static_configs": [
                    {"targets": [f"{node.address}:{slurm_nodes.DAEMON_PORT}"], "labels": {"node": name}}
                    for name, node in box.fleet.nodes.items()
                ],
            }
        ],
    }


def _start_prometheus(box: Box) -> None:
    assert PROMETHEUS is not None
    directory = box.fleet.base / "prometheus"
    directory.mkdir()
    (directory / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(box)))
    port = free_port("127.0.0.1")
    argv = [
        PROMETHEUS,
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    box.prometheus = _start_server("prometheus", argv, f"http://127.0.0.1:{port}", box.fleet.base)


FEDERATION = REPO / "deploy" / "federation"


def start_federation(box: Box, racks: dict[str, list[str]]) -> tuple[list[Server], Server]:
    """deploy/federation/'s example, live: a Prometheus per rack (``racks``: rack name -> its nodes)
    with gpumon's recording rules, and a global Prometheus federating their recorded series.
    The examples' files are used as they are but for addresses, intervals and rule paths."""
    assert PROMETHEUS is not None
    rack_example = yaml.safe_load((FEDERATION / "prometheus-rack.example.yml").read_text())
    global_example = yaml.safe_load((FEDERATION / "prometheus-global.example.yml").read_text())
    servers: list[Server] = []

    def start(name: str, config: dict[str, Any]) -> Server:
        directory = box.fleet.base / name
        directory.mkdir()
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port("127.0.0.1")
        argv = [
            PROMETHEUS,
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        server = _start_server(name, argv, f"http://127.0.0.1:{port}", box.fleet.base)
        servers.append(server)
        return server

    fast = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    try:
        rack_servers = []
        for rack, nodes in racks.items():
            config = dict(rack_example)
            config["global"] = {**config["global"], **fast, "external_labels": {"rack": rack}}
            config["rule_files"] = [str(RULE_FILES[0])]
            config.pop("alerting")
            targets = [f"{box.fleet.nodes[n].address}:{slurm_nodes.DAEMON_PORT}" for n in nodes]
            config["scrape_configs"] = [{**config["scrape_configs"][0], "static_configs": [{"targets": targets}]}]
            rack_servers.append(start(f"prometheus-{rack}", config))
        config = dict(global_example)
        config["global"] = {**config["global"], **fast}
        job = dict(config["scrape_configs"][0])
        job["static_configs"] = [{"targets": [s.url.removeprefix("http://") for s in rack_servers]}]
        config["scrape_configs"] = [job]
        return rack_servers, start("prometheus-global", config)
    except BaseException:
        stop_servers(box, servers)
        raise


def stop_servers(box: Box, servers: list[Server]) -> None:
    """SIGTERM each (our children: waited for, so no zombie holds its pid), SIGKILL after 3 s (an
    Alertmanager of a pair whose peer is gone waits longer to leave the cluster; nothing is kept)."""
    for server in servers:
        with contextlib.suppress(ProcessLookupError):
            server.proc.terminate()
    deadline = time.monotonic() + 3
    for server in servers:
        try:
            server.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(5)
        (box.fleet.base / f"{server.name}.pid").unlink(missing_ok=True)


def start_box(nodes: int = 3, scenarios: dict[str, str] | None = None, webhook_url: str | None = None) -> Box:
    """The whole box, up and scraped; on any failure everything made so far is removed before raising."""
    if not 1 <= nodes <= 9:
        raise ValueError(f"--nodes {nodes}: between 1 and 9")
    names = tuple(f"n{i}" for i in range(1, nodes + 1))
    fleet = slurm_nodes.start(names)
    box = Box(fleet, {name: (scenarios or {}).get(name, SCENARIOS[i % len(SCENARIOS)]) for i, name in enumerate(names)})
    try:
        _start_alertmanagers(box, webhook_url)
        fleet.extra_config = {
            "alerting": {
                "alertmanagers": [am.url for am in box.alertmanagers],
                "host": "{node}",
                "resend_interval": "30s",
            }
        }
        specs = {
            name: fleet.scenario_file(scenario, job_scenario()) if scenario == "healthy-job" else scenario
            for name, scenario in box.scenarios.items()
        }
        fleet.prepare(specs, max_drained_share=MAX_DRAINED_SHARE)
        _start_prometheus(box)
        fleet.enable("health")
        wait_for(lambda: len(box.query('up{job="gpumon"} == 1')) == nodes, 60, 0.3, "Prometheus to scrape every node")
    except BaseException:
        stop_box(box)
        raise
    return box


def stop_box(box: Box) -> None:
    """Stop everything and remove what the box made (never raises)."""
    stop_servers(box, [*box.alertmanagers, *([box.prometheus] if box.prometheus else [])])
    slurm_nodes.stop(box.fleet)


# ---- make cluster / make cluster-down ---------------------------------------------------------------
def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its parent."""
    proc = Path(f"/proc/{pid}")
    return pid_alive(pid) and proc.exists() and "zombie" not in (proc / "status").read_text().lower()


def _running() -> dict[str, Any] | None:
    if not STATE_FILE.exists():
        return None
    with contextlib.suppress(ValueError, OSError):
        info = dict(json.loads(STATE_FILE.read_text()))
        if _alive(int(info["pid"])):
            return info
    STATE_FILE.unlink(missing_ok=True)
    return None


def up(nodes: int) -> int:
    if not 1 <= nodes <= 9:
        print(f"make cluster: NODES={nodes}: between 1 and 9", file=sys.stderr)
        return 2
    reason = missing_reason()
    if reason is not None:
        print(f"make cluster: cannot build the fleet box here: {reason}", file=sys.stderr)
        return 2
    running = _running()
    if running is not None:
        print(f"make cluster: a fleet box is already up (keeper pid {running['pid']}):\n{running['guide']}")
        return 0
    started = time.monotonic()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            message = pipe.read()
        if not message.startswith("{"):
            print(f"make cluster: the fleet box did not come up: {message.strip() or 'keeper died'}", file=sys.stderr)
            return 1
        print(json.loads(message)["guide"])
        print(f"  (up in {time.monotonic() - started:.0f} s)")
        return 0
    os.close(read_end)
    os.setsid()
    log = os.open(KEEPER_LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    stop = False

    def on_signal(_signum: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        box = start_box(nodes)
    except BaseException as exc:
        os.write(write_end, f"{type(exc).__name__}: {exc}".encode()[:4000])
        os._exit(1)
    info = {"pid": os.getpid(), "base": str(box.fleet.base), "guide": box.guide()}
    STATE_FILE.write_text(json.dumps(info))
    os.write(write_end, json.dumps(info).encode())
    os.close(write_end)
    while not stop:
        time.sleep(0.5)
    stop_box(box)
    STATE_FILE.unlink(missing_ok=True)
    os._exit(0)


def down() -> int:
    running = _running()
    if running is None:
        KEEPER_LOG.unlink(missing_ok=True)  # a box that ended on its own leaves no log behind either
        print("make cluster-down: no fleet box is up")
        return 0
    pid = int(running["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        print(f"make cluster-down: the keeper (pid {pid}) did not stop in 120 s", file=sys.stderr)
        return 1
    KEEPER_LOG.unlink(missing_ok=True)
    print(f"make cluster-down: stopped; {running['base']} and the keeper's log removed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fleet.box", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="build the fleet box and print where to look")
    p_up.add_argument("--nodes", type=int, default=3, help="nodes (1-9, default 3)")
    sub.add_parser("down", help="stop the fleet box and remove everything it made")
    args = parser.parse_args(argv)
    return up(args.nodes) if args.command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())

"""The fleet in a box (tests/fleet/box.py, what ``make cluster`` builds), as a site evaluating
gpumon would look at it: three Slurm nodes with a gpumon daemon each (n1 healthy, running Slurm
job 1001; n2 loses GPU 1 to XID 79; n3 a straggler), a Prometheus with gpumon's rules, an
Alertmanager HA pair.

* Slurm's own health check drains n2, and only n2;
* both Alertmanagers hold the alert once each (from gpumon and from Prometheus), and the pair
  notifies once;
* every query of the fleet dashboard runs against the real Prometheus and shows the lost GPU;
* ``srun -N3 gpumon burn`` (ranks and rendezvous from Slurm) gives one report naming the node
  made slow, or the node killed mid-run;
* job 1001's energy counter is the energy its GPUs report, on the energy dashboard with its cost;
* a global Prometheus federating two rack servers (deploy/federation/) keeps only recorded series.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from gpumon.util.state.files import health_dir
from tests.alerts.helpers import TestReceiver
from tests.fleet import box as box_mod
from tests.fleet.box import Box
from tests.helpers import REPO, wait_for

DASHBOARD = REPO / "dashboards" / "gpumon-fleet.json"


@pytest.fixture(scope="module")
def receiver() -> Iterator[TestReceiver]:
    r = TestReceiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def box(receiver: TestReceiver) -> Iterator[Box]:
    reason = box_mod.missing_reason()
    if reason is not None:
        pytest.skip(reason)
    started = box_mod.start_box(3, webhook_url=f"{receiver.url}/fleet")
    try:
        yield started
    finally:
        box_mod.stop_box(started)


def test_without_root_or_namespaces_make_cluster_says_so_and_stops(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(box_mod, "missing_reason", lambda: "the multi-node Slurm cluster needs root")
    assert box_mod.up(3) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs root" in err


def test_a_planted_xid_79_on_node_2_drains_node_2_through_slurms_health_check(box: Box) -> None:
    fleet = box.fleet
    wait_for(lambda: fleet.drained() == {"n2"}, 90, 0.3, "Slurm's health check to drain n2")
    reason = fleet.node_info()["n2"]["reason"]
    assert reason.startswith("gpumon: GPU 1 xid 79"), reason
    assert fleet.unusable() == {"n2"}


def test_both_alertmanagers_hold_the_alert_once_and_the_pair_notifies_once(box: Box, receiver: TestReceiver) -> None:
    def held() -> bool:
        return all(box.am_alerts(am, alertname="GpuLost", gpu="1") for am in box.alertmanagers) and all(
            len(box.am_alerts(am, alertname="GpuLost")) == 2 for am in box.alertmanagers
        )

    wait_for(held, 90, 0.5, "GpuLost from gpumon and from Prometheus in both Alertmanagers")
    for am in box.alertmanagers:
        from_gpumon = box.am_alerts(am, alertname="GpuLost", host="n2")
        from_prometheus = box.am_alerts(am, alertname="GpuLost", node="n2")
        assert len(from_gpumon) == 1 and len(from_prometheus) == 1, box.am_alerts(am)
        assert not box.am_alerts(am, node="n1") and not box.am_alerts(am, host="n1")

    def notified() -> list[Any]:
        return [a for a in receiver.alerts() if a["labels"].get("alertname") == "GpuLost"]

    wait_for(lambda: len(notified()) >= 2, 60, 0.2, "the pair to notify GpuLost (gpumon's and Prometheus')")
    # The second Alertmanager waits its peer timeout (5 s) before it would notify: watch until 12 s
    # after the first notification.
    first = min(r.at for r in list(receiver.received))
    deadline = first + 12
    while time.monotonic() < deadline:
        assert len(notified()) == 2, [(a["labels"], a["startsAt"]) for a in notified()]
        time.sleep(0.5)


def _panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append((panel["title"], target["expr"]))
    return out


def _instantiate(expr: str) -> str:
    """A panel's PromQL as Grafana would send it with every host and GPU selected."""
    values = {"$__rate_interval": "1m", "$__interval": "10s", "$__range": "1h", "$cost_per_kwh": "0.15"}
    for var, value in {**values, "$instance": ".*", "$gpu": ".*"}.items():
        expr = expr.replace(var, value)
    assert not re.search(r"\$\w", expr), expr
    return expr


def test_every_fleet_dashboard_query_runs_on_the_real_prometheus_and_shows_the_lost_gpu(box: Box) -> None:
    queries = _panel_queries()
    assert len(queries) > 20
    wait_for(lambda: box.query("count(gpumon_gpu_up == 0)"), 60, 0.5, "Prometheus to see the lost GPU")
    for _title, expr in queries:
        box.query(_instantiate(expr))  # raises with Prometheus' error on a bad query

    def single(title: str) -> float:
        expr = next(e for t, e in queries if t == title)
        (sample,) = box.query(_instantiate(expr))
        return float(sample["value"][1])

    wait_for(lambda: single("Nodes CRITICAL (gpumon health)") == 1, 60, 0.5, "n2 CRITICAL on the dashboard")
    assert single("GPUs lost") == 1
    assert single("GPUs with XIDs (24 h)") >= 1
    assert single("GPUs monitored") == 2 + 2 + 4  # healthy-job: 2, gpu-lost: 2, straggler: 4
    node2 = box.fleet.nodes["n2"].address
    lost = box.query('gpumon_gpu_up{node="n2"} == 0')
    assert [(s["metric"]["instance"], s["metric"]["gpu"]) for s in lost] == [(f"{node2}:10480", "1")]


def test_energy_per_job_on_the_dashboard_is_the_energy_the_jobs_gpus_report(box: Box) -> None:
    """n1's two simulated GPUs run Slurm job 1001 from the first poll, their energy counters from 0:
    the job's counter equals the sum of the GPUs' counters, and the dashboard's job table shows it."""
    wait_for(lambda: box.query('gpumon_owner_energy_joules_total{node="n1"} > 10000'), 60, 0.5, "job 1001's energy")
    (job,) = box.query('gpumon_owner_energy_joules_total{node="n1"}')
    assert (job["metric"]["owner_kind"], job["metric"]["owner"]) == ("slurm_job", box_mod.JOB_ID)

    def difference_joules() -> float:  # the job's counter and its GPUs' counters of one scrape
        (sample,) = box.query(
            'gpumon_owner_energy_joules_total{node="n1"} - on () sum(gpumon_energy_joules_total{node="n1"})'
        )
        return abs(float(sample["value"][1]))

    wait_for(lambda: difference_joules() < 1.0, 30, 0.5, "job 1001's joules to equal its GPUs' energy counters")
    dashboard = json.loads((REPO / "dashboards" / "gpumon-burn-energy.json").read_text())
    (panel,) = [p for p in dashboard["panels"] if p["title"] == "Energy and cost per job in the time range"]
    kwh, cost = (box.query(_instantiate(t["expr"])) for t in panel["targets"])
    assert [s["metric"]["owner"] for s in kwh] == [box_mod.JOB_ID]
    assert float(cost[0]["value"][1]) == pytest.approx(float(kwh[0]["value"][1]) * 0.15)


def test_a_global_prometheus_federating_two_rack_servers_keeps_only_recorded_series(box: Box) -> None:
    """deploy/federation/: rack a (n1, n2) and rack b (n3), each with gpumon's recording rules; the
    global server holds the per-host roll-ups of all three nodes, labelled by rack, and no raw series."""
    racks, global_server = box_mod.start_federation(box, {"a": ["n1", "n2"], "b": ["n3"]})
    try:

        def query(expr: str) -> list[Any]:
            body = requests.get(f"{global_server.url}/api/v1/query", params={"query": expr}, timeout=10).json()
            assert body["status"] == "success", body
            return list(body["data"]["result"])

        wait_for(lambda: len(query("instance:gpumon_gpus:count")) == 3, 60, 0.5, "the global view of every host")
        counts = {
            (s["metric"]["rack"], s["metric"]["instance"].split(":")[0]): float(s["value"][1])
            for s in query("instance:gpumon_gpus:count")
        }
        nodes = box.fleet.nodes
        assert counts == {("a", nodes["n1"].address): 2, ("a", nodes["n2"].address): 2, ("b", nodes["n3"].address): 4}
        wait_for(
            lambda: query("instance:gpumon_node_health_status:max == 2"), 60, 0.5, "n2 CRITICAL in the global view"
        )
        (critical,) = query("instance:gpumon_node_health_status:max == 2")
        assert critical["metric"]["instance"].startswith(nodes["n2"].address + ":")
        assert query('count({__name__=~"gpumon_.+"})') == []  # raw per-GPU series stay on the racks
    finally:
        box_mod.stop_servers(box, [*racks, global_server])


def test_srun_burn_on_three_nodes_gives_one_report_naming_the_node_made_slow(box: Box) -> None:
    fleet = box.fleet
    fleet.reset()  # health checks off, n2 back in service: the burn needs all three nodes
    out = fleet.base / "burn"
    out.mkdir(exist_ok=True)
    script = (
        'if [ "$SLURM_NODEID" = 1 ]; then export GPUMON_BURN_INJECT=slow:0; fi; '
        f"exec {sys.executable} -m gpumon burn --device cpu --backend fake --gpus 0 --tests matmul,allreduce "
        f"--duration 2 --state-dir {out}/state-$SLURMD_NODENAME --json {out}/report-$SLURMD_NODENAME.json"
    )
    env = {k: v for k, v in fleet.env.items() if not k.startswith(("GPUMON_BURN_", "GLOO_"))}
    env["PYTHONPATH"] = str(REPO)  # the nodes share one host name, resolved to loopback: gpumon finds eth0
    done = subprocess.run(["srun", "-N3", "bash", "-c", script], capture_output=True, text=True, env=env, timeout=240)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 1, done.stderr[-2000:]  # a fault, on every task: one exit code
    reports = sorted(p.name for p in out.glob("report-*.json"))
    assert reports == ["report-n1.json"]  # one JSON, from the first rank
    report = json.loads((out / "report-n1.json").read_text())
    assert report["options"]["launch"] == "slurm" and report["options"]["world_size"] == 3
    assert [(g["node"], g["hostname"], g["gpu"]) for g in report["gpus"]] == [(0, "n1", 0), (1, "n2", 0), (2, "n3", 0)]
    assert len(report["faults"]) == 1 and report["faults"][0].startswith("node 1 (n2) GPU 0"), report["faults"]
    assert "matmul" in report["faults"][0]
    assert done.stdout.count("gpumon burn — verdict") == 1 and "FAULT node 1 (n2) GPU 0" in done.stdout
    for name in ("n2", "n3"):  # each node keeps the fleet report for its own daemon (a simulated run's: apart)
        simulated = health_dir(out / f"state-{name}", "fake").parent
        assert json.loads((simulated / "burn" / "last.json").read_text())["faults"] == report["faults"]


def test_srun_fingerprint_names_the_node_whose_gpu_computes_the_same_wrong_answer_every_time(box: Box) -> None:
    """One GPU per node, n2's made to flip the same bit every time (sdc:0): its repeated GEMMs agree, so
    only the fleet-wide fingerprint (each digest against the majority of the same model) can name it."""
    fleet = box.fleet
    fleet.reset()
    out = fleet.base / "fingerprint"
    out.mkdir(exist_ok=True)
    script = (
        'if [ "$SLURM_NODEID" = 1 ]; then export GPUMON_BURN_INJECT=sdc:0; fi; '
        f"exec {sys.executable} -m gpumon burn --device cpu --backend fake --gpus 0 --tests fingerprint,matmul "
        f"--duration 1 --state-dir {out}/state-$SLURMD_NODENAME --json {out}/report-$SLURMD_NODENAME.json"
    )
    env = {k: v for k, v in fleet.env.items() if not k.startswith(("GPUMON_BURN_", "GLOO_"))}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(["srun", "-N3", "bash", "-c", script], capture_output=True, text=True, env=env, timeout=240)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads((out / "report-n1.json").read_text())
    assert report["faults"][0].startswith("node 1 (n2) GPU 0"), report["faults"]
    assert "fingerprint: bf16, fp32, fp64, memory results differ from the majority" in report["faults"][0]
    assert all(f.startswith("node 1 (n2) GPU 0") for f in report["faults"]), report["faults"]
    repeat = [c for c in report["checks"] if c["check"] == "bit_exact_repeat"]
    assert repeat and all(c["passed"] for c in repeat)  # the self-check cannot see a consistent error
    digests = {g["hostname"]: g["fingerprint"]["digests"] for g in report["gpus"]}
    assert digests["n1"] == digests["n3"] != digests["n2"]


def test_a_node_lost_mid_srun_burn_is_named_within_the_heartbeat_timeout(box: Box) -> None:
    """n3's whole burn (agent and workers) is SIGKILLed once it runs: the first rank names n3 as
    lost after the heartbeat timeout (3 s) and reports the GPUs of the two others."""
    fleet = box.fleet
    fleet.reset()
    out = fleet.base / "lost"
    out.mkdir(exist_ok=True)
    burn = (
        f"{sys.executable} -m gpumon burn --device cpu --backend fake --gpus 0 --tests matmul --duration 60 "
        f"--heartbeat-timeout 3 --state-dir {out}/state-$SLURMD_NODENAME --json {out}/report-$SLURMD_NODENAME.json"
    )
    script = (
        f'if [ "$SLURM_NODEID" = 2 ]; then setsid {burn} & pid=$!; '
        f"while [ ! -f {health_dir(out / 'state-n3', 'fake').parent}/burn/running.json ]; do sleep 0.2; done; sleep 3; "
        "kill -9 -- -$pid; exit 137; fi; "
        f"exec {burn}"
    )
    env = {k: v for k, v in fleet.env.items() if not k.startswith(("GPUMON_BURN_", "GLOO_"))}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(["srun", "-N3", "bash", "-c", script], capture_output=True, text=True, env=env, timeout=240)
    report = json.loads((out / "report-n1.json").read_text())
    assert report["exit_code"] == 1, done.stderr[-2000:]
    assert len(report["faults"]) == 1 and report["faults"][0].startswith("node 2 (n3) lost: its agent sent nothing")
    assert [g["hostname"] for g in report["gpus"]] == ["n1", "n2"]  # the survivors' GPUs, not blamed


def test_the_box_guide_says_where_to_look_and_what_each_node_shows(box: Box) -> None:
    guide = box.guide()
    assert box.prometheus is not None and box.prometheus.url in guide
    assert all(am.url in guide for am in box.alertmanagers)
    for name, node in box.fleet.nodes.items():
        line = next(line for line in guide.splitlines() if line.strip().startswith(f"{name} "))
        assert node.url in line and box.scenarios[name] in line

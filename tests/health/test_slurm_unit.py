"""The Slurm step's rules without a cluster: parsing scontrol, the decision, the epilog burn."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.commands.health_slurm import epilog_burn
from gpumon.config.file import Config
from gpumon.health.config import HealthConfig, SlurmConfig, parse_slurm
from gpumon.health.slurm import OwnDrain, act, decide, keeps_drain
from gpumon.health.slurm_commands import Scontrol
from gpumon.health.slurm_nodes import NodeState, parse_nodes, parse_sinfo_json
from gpumon.model.findings import CRITICAL, Finding, verdict

SHOW = (
    "NodeName=g1 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu,all "
    "Reason=gpumon: GPU 1 xid 79 fallen off the bus: reboot node [root@2026-11-23T01:20:05]\n"
    "NodeName=g2 State=DOWN+NOT_RESPONDING Partitions=gpu Reason=Not responding [slurm@2026-11-23T01:00:00]\n"
    "NodeName=g3 State=MIXED Partitions=gpu\n"
)
CONFIG = SlurmConfig(enabled=True, node_name="g1", max_drained_share=0.5)
FAULT = verdict(
    [Finding(kind="xid", severity=CRITICAL, action="reboot_node", summary="xid 79 fallen off the bus", gpu=1)],
    [],
    0.0,
    "local",
)
OK = verdict([], [(0, None)], 0.0, "local")


def test_parse_scontrol_show_node() -> None:
    nodes = parse_nodes(SHOW)
    assert nodes[0] == NodeState(
        name="g1",
        state="IDLE+DRAIN",
        reason="gpumon: GPU 1 xid 79 fallen off the bus: reboot node",
        partitions=("gpu", "all"),
        reason_time_seconds=time.mktime((2026, 11, 23, 1, 20, 5, 0, 0, -1)),
    )
    assert nodes[0].drained and not nodes[1].drained and nodes[2].reason == ""


def test_decisions() -> None:
    idle = NodeState("g1", "IDLE", "", ("gpu",))
    ours = NodeState("g1", "IDLE+DRAIN", "gpumon: GPU 1 xid 79 fallen off the bus: reboot node", ("gpu",))
    foreign = NodeState("g1", "IDLE+DRAIN", "bad fan", ("gpu",))
    peers = [NodeState("g2", "IDLE", "", ("gpu",))]
    assert decide(FAULT, idle, [idle, *peers], CONFIG).step == "drain"
    own = OwnDrain("g1", ours.reason, None)
    assert decide(FAULT, ours, [ours, *peers], CONFIG, own).step == "none"
    assert decide(FAULT, foreign, [foreign, *peers], CONFIG).step == "none"
    assert decide(OK, ours, [ours, *peers], CONFIG, own).step == "resume"
    assert decide(OK, ours, [ours, *peers], CONFIG).step == "none"  # not recorded: not gpumon's
    assert decide(OK, foreign, [foreign, *peers], CONFIG).step == "none"
    drained_peer = [NodeState("g2", "DOWN+DRAIN", "gpumon: node lost", ("gpu",))]
    refused = decide(FAULT, idle, [idle, *drained_peer], CONFIG)
    assert refused.step == "refused" and refused.message.startswith("circuit breaker: 1 of 2 nodes of gpu")
    down_peer = [NodeState("g2", "DOWN", "Not responding", ("gpu",))]
    assert decide(FAULT, idle, [idle, *down_peer], CONFIG).step == "refused"
    other_partition = [NodeState("g9", "DOWN+DRAIN", "gpumon: node lost", ("cpu",))]
    assert decide(FAULT, idle, [idle, *peers, *other_partition], CONFIG).step == "drain"
    assert decide(FAULT, idle, [idle], CONFIG).step == "refused"  # 1 of 1 would exceed 50 %


def test_drain_reason_names_gpu_finding_and_action() -> None:
    decision = decide(FAULT, NodeState("g1", "IDLE", "", ("gpu",)), [], CONFIG)
    assert decision.reason == "gpumon: GPU 1 xid 79 fallen off the bus: reboot node"


def test_scontrol_that_hangs_is_unknown_and_recorded(tmp_path: Path) -> None:
    def hang(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    decision = act(FAULT, CONFIG, tmp_path, env={}, client=Scontrol(CONFIG, run=hang), clock=lambda: 5.0)
    assert decision.step == "unknown"
    assert decision.message == "Slurm step UNKNOWN: sinfo did not answer within 10 s"
    assert '"step": "unknown"' in (tmp_path / "health" / "actions.jsonl").read_text()


def test_scontrol_missing_is_unknown(tmp_path: Path) -> None:
    config = SlurmConfig(
        enabled=True, node_name="g1", scontrol=str(tmp_path / "no-scontrol"), sinfo=str(tmp_path / "no-sinfo")
    )
    assert act(FAULT, config, tmp_path, env={}).message.endswith("no-scontrol not found")


def test_epilog_burns_the_failed_jobs_gpus_only_when_enabled(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "")

    on = Config(health=HealthConfig(slurm=SlurmConfig(enabled=True, epilog_burn=True)))
    off = Config(health=HealthConfig(slurm=SlurmConfig(enabled=True)))
    failed = {"SLURM_JOB_EXIT_CODE": "256", "SLURM_JOB_GPUS": "2,3", "SLURM_JOB_ID": "7"}
    assert epilog_burn(off, tmp_path, failed, run) is None
    assert epilog_burn(on, tmp_path, {**failed, "SLURM_JOB_EXIT_CODE": "0"}, run) is None
    assert calls == []
    assert epilog_burn(on, tmp_path, failed, run) == 1
    assert calls[0][1:] == ["-m", "gpumon", "burn", "--quick", "--state-dir", str(tmp_path), "--gpus", "2,3"]


class FakeClock:
    """Seconds that pass only when gpumon sleeps (or a test sets them)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# ---- a simulated controller: sinfo --json and scontrol show node -o as Slurm 22.05 prints them -------------------
class FakeSlurm:
    """Answers gpumon's sinfo / scontrol calls from a table of nodes; updates change the table.

    ``delay_seconds`` makes every call slow (a busy controller); ``read_gate`` runs before each read."""

    def __init__(self, nodes: dict[str, dict[str, Any]], clock: Any = None, delay_seconds: float = 0.0) -> None:
        self.nodes = nodes
        self.clock = clock or FakeClock()
        self.delay_seconds = delay_seconds
        self.commands: list[list[str]] = []
        self.lock = threading.Lock()
        self.read_gate: Any = None

    @classmethod
    def of(cls, *names: str, **kwargs: Any) -> FakeSlurm:
        table = {
            n: {"state": "IDLE", "flags": [], "reason": "", "time": 0, "partitions": ["gpu"], "comment": ""}
            for n in names
        }
        return cls(table, **kwargs)

    def set(self, name: str, **fields: Any) -> None:
        self.nodes[name].update(fields)

    def admin_drain(self, name: str, reason: str) -> None:
        self.set(name, flags=["DRAIN"], reason=reason, time=int(self.clock()))

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        is_read = cmd[1:] in (["--json"], ["show", "node", "-o"])
        if is_read and self.read_gate is not None:
            self.read_gate()
        with self.lock:
            self.commands.append(cmd)
            if cmd[1:] == ["--json"]:
                return subprocess.CompletedProcess(cmd, 0, self.json(), "")
            if cmd[1:] == ["show", "node", "-o"]:
                return subprocess.CompletedProcess(cmd, 0, self.text(), "")
            if cmd[1] == "update":
                args = dict(a.split("=", 1) for a in cmd[2:])
                node = self.nodes[args["nodename"]]
                if args.get("state") == "drain":
                    node.update(flags=sorted({*node["flags"], "DRAIN"}), reason=args["reason"], time=int(self.clock()))
                elif args.get("state") in ("resume", "undrain"):
                    node.update(flags=[f for f in node["flags"] if f != "DRAIN"], reason="", time=0)
                if "comment" in args:
                    node["comment"] = args["comment"]
                return subprocess.CompletedProcess(cmd, 0, "", "")
        return subprocess.CompletedProcess(cmd, 1, "", f"unexpected {cmd}")

    def json(self) -> str:
        nodes = [
            {
                "name": name,
                "state": n["state"].lower(),
                "state_flags": n["flags"],
                "reason": n["reason"],
                "reason_changed_at": n["time"],
                "reason_set_by_user": "root",
                "partitions": n["partitions"],
                "comment": n["comment"],
            }
            for name, n in self.nodes.items()
        ]
        return json.dumps({"meta": {}, "errors": [], "nodes": nodes})

    def text(self) -> str:
        return "".join(
            show_line(name, "+".join([n["state"], *n["flags"]]), n["partitions"], n["reason"], n["time"], n["comment"])
            for name, n in self.nodes.items()
        )

    def drained(self) -> set[str]:
        return {name for name, n in self.nodes.items() if "DRAIN" in n["flags"]}

    def updates(self) -> list[list[str]]:
        return [c for c in self.commands if c[1] == "update"]


def show_line(
    name: str, state: str, partitions: list[str], reason: str, at: float, comment: str, *, extra: str = ""
) -> str:
    """One node as Slurm 22.05's ``scontrol show node -o`` prints it: Reason, then Comment and more after it."""
    line = (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUTot=1 CPULoad=0.01 "
        f"OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC Debian RealMemory=1 State={state} ThreadsPerCore=1 "
        f"Partitions={','.join(partitions)}  BootTime=2026-11-26T22:17:34 CfgTRES=cpu=1,mem=1M,billing=1 "
        "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s"
    )
    if reason:
        line += f" Reason={reason} [root@{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(at))}]"
    if comment:
        line += f" Comment={comment}"
    return line + extra + "\n"


def _critical(*findings: tuple[int, str, str]) -> Any:
    return verdict(
        [Finding(kind="xid", severity=CRITICAL, action=a, summary=s, gpu=g) for g, s, a in findings], [], 0.0, "local"
    )


def _act(report: Any, fake: FakeSlurm, state: Path, node: str = "g1", **config: Any) -> Any:
    settings = {"enabled": True, "node_name": node, "max_drained_share": 1.0, **config}
    cfg = SlurmConfig(**settings)
    sleep = fake.clock.sleep if isinstance(fake.clock, FakeClock) else time.sleep
    return act(report, cfg, state, env={}, client=Scontrol(cfg, run=fake), clock=fake.clock, sleep=sleep)


REASON = "gpumon: GPU 1 xid 79 fallen off the bus: reboot node"


def test_a_comment_after_the_reason_does_not_make_gpumon_drain_again(tmp_path: Path) -> None:
    """Slurm prints Comment= after Reason=; gpumon's own drain stays one drain with its first time."""
    for reader in ("sinfo", "scontrol"):
        fake = FakeSlurm.of("g1", "g2", clock=FakeClock(1_000_000.0))
        sinfo = "sinfo" if reader == "sinfo" else str(tmp_path / "no-sinfo")  # no sinfo: scontrol's text
        state = tmp_path / reader
        assert _act(FAULT, fake, state, sinfo=sinfo).step == "drain"
        fake.set("g1", comment="ticket 42 Reason=see ops")
        fake.clock.now += 600
        again = _act(FAULT, fake, state, sinfo=sinfo)
        assert again.step == "none", again
        assert len(fake.updates()) == 1  # no second drain
        assert fake.nodes["g1"]["time"] == 1_000_000 and fake.nodes["g1"]["reason"] == REASON


def test_an_admin_drain_that_looks_like_gpumons_is_not_resumed(tmp_path: Path) -> None:
    fake = FakeSlurm.of("g1", "g2")
    fake.admin_drain("g1", REASON)  # an admin wrote gpumon's words; gpumon never drained it
    done = _act(OK, fake, tmp_path)
    assert done.step == "none"
    assert fake.drained() == {"g1"} and fake.updates() == []


def test_a_ticket_an_admin_appended_to_gpumons_reason_is_kept(tmp_path: Path) -> None:
    fake = FakeSlurm.of("g1", "g2")
    assert _act(FAULT, fake, tmp_path).step == "drain"
    fake.admin_drain("g1", f"{REASON} INC-4711")
    assert _act(FAULT, fake, tmp_path).step == "none"
    assert _act(_critical((0, "xid 48 double bit ECC error", "reset_gpu")), fake, tmp_path).step == "none"
    assert _act(OK, fake, tmp_path).step == "none"  # the admin has taken the drain over
    assert fake.nodes["g1"]["reason"] == f"{REASON} INC-4711" and fake.drained() == {"g1"}


def test_gpumons_own_drain_is_resumed_and_its_reason_updated(tmp_path: Path) -> None:
    fake = FakeSlurm.of("g1", "g2")
    assert _act(FAULT, fake, tmp_path).step == "drain"
    worse = _critical((1, "xid 79 fallen off the bus", "reboot_node"), (0, "xid 48 double bit ECC error", "replace"))
    assert _act(worse, fake, tmp_path).step == "drain"  # its own reason, updated
    assert "GPU 0" in fake.nodes["g1"]["reason"]
    assert _act(OK, fake, tmp_path).step == "resume"
    assert fake.drained() == set()


def test_down_and_admin_drained_nodes_count_for_the_breaker(tmp_path: Path) -> None:
    fake = FakeSlurm.of("g1", "g2", "g3", "g4")
    fake.set("g2", state="DOWN", reason="Not responding", time=5)
    fake.admin_drain("g3", "bad fan")
    refused = _act(FAULT, fake, tmp_path, max_drained_share=0.5)
    assert refused.step == "refused", refused  # 3 of 4 could not take work
    assert fake.drained() == {"g3"}
    assert _act(FAULT, fake, tmp_path / "b", max_drained_share=0.75).step == "drain"


def test_the_breaker_never_lets_the_drained_share_exceed_its_limit() -> None:
    """0.5 of 3 nodes: one may be drained, not two (the share after the drain counts)."""
    fake = FakeSlurm.of("g1", "g2", "g3")
    fake.admin_drain("g2", REASON)
    with tempfile.TemporaryDirectory() as tmp:
        assert _act(FAULT, fake, Path(tmp), max_drained_share=0.5).step == "refused"
    assert fake.drained() == {"g2"}


def _simultaneous_checks(state: Path) -> tuple[FakeSlurm, dict[str, Any]]:
    """g1-g3 all CRITICAL, checking at once: every node reads the partition before any drains."""
    fake = FakeSlurm.of("g1", "g2", "g3", clock=time.time, delay_seconds=0.05)
    barrier = threading.Barrier(3)
    reads: dict[str, int] = {}

    def gate() -> None:
        me = threading.current_thread().name
        reads[me] = reads.get(me, 0) + 1
        if reads[me] == 1:
            barrier.wait(10)

    fake.read_gate = gate
    decisions: dict[str, Any] = {}

    def check(name: str) -> None:
        decisions[name] = _act(FAULT, fake, state / name, node=name, max_drained_share=0.5)

    threads = [threading.Thread(target=check, args=(n,), name=n) for n in ("g1", "g2", "g3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return fake, decisions


def test_the_breaker_holds_when_every_node_checks_at_once(tmp_path: Path) -> None:
    """Three nodes read the partition before any drains (a slow controller): exactly one stays drained."""
    for trial in range(3):
        fake, decisions = _simultaneous_checks(tmp_path / str(trial))
        assert len(fake.drained()) == 1, (fake.drained(), decisions)
        assert sorted(d.step for d in decisions.values()) == ["drain", "refused", "refused"]


def test_the_drain_reason_names_every_bad_gpu(tmp_path: Path) -> None:
    two = _critical((1, "xid 79 fallen off the bus", "reboot_node"), (0, "xid 48 double bit ECC error", "reset_gpu"))
    reason = decide(two, NodeState("g1", "IDLE", "", ("gpu",)), [], CONFIG).reason
    assert reason is not None and "GPU 0" in reason and "GPU 1" in reason
    many = _critical(
        *[(i, f"xid 79 fallen off the bus after a long story number {i}", "reboot_node") for i in range(8)]
    )
    long_reason = decide(many, NodeState("g1", "IDLE", "", ("gpu",)), [], CONFIG).reason
    assert long_reason is not None and len(long_reason) <= 200
    assert all(re.search(rf"\bGPU {i}\b|\b{i}\b", long_reason) for i in range(8)), long_reason


def test_gpumon_reads_the_nodes_with_the_configured_sinfo(tmp_path: Path) -> None:
    fake = FakeSlurm.of("g1")
    _act(OK, fake, tmp_path, sinfo="/opt/slurm/bin/sinfo")
    assert fake.commands[0] == ["/opt/slurm/bin/sinfo", "--json"]


_text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="[]\n"), min_size=1)


@settings(max_examples=200)
@given(
    reason=_text.map(str.strip).filter(bool),
    comment=st.one_of(st.just(""), _text.map(str.strip)),
    extra=st.sampled_from(["", " Extra=a b=c", " ReservationName=maint window ResumeAfterTime=None"]),
    state=st.sampled_from(["IDLE+DRAIN", "MIXED+DRAIN", "DOWN+DRAIN+NOT_RESPONDING"]),
)
def test_parse_show_node_finds_the_reason_whatever_it_holds_and_whatever_follows(
    reason: str, comment: str, extra: str, state: str
) -> None:
    line = show_line("g7", state, ["gpu", "all"], reason, 1_800_000_000, comment, extra=extra)
    other = show_line("g8", "IDLE", ["gpu"], "", 0, "")
    node, nxt = parse_nodes(line + other)
    assert (node.name, node.state, node.reason, node.partitions) == ("g7", state, reason, ("gpu", "all"))
    assert node.reason_time_seconds == 1_800_000_000
    assert (nxt.name, nxt.reason, nxt.drained) == ("g8", "", False)


def test_after_simultaneous_drains_the_earliest_keep_theirs_by_time_then_name() -> None:
    def drained(name: str, at: float, reason: str = REASON) -> NodeState:
        return NodeState(name, "IDLE+DRAIN", reason, ("gpu",), at)

    config = SlurmConfig(enabled=True, max_drained_share=0.5)  # 2 of 4 may be unusable
    idle = NodeState("g4", "IDLE", "", ("gpu",))
    same_second = [drained("g3", 100), drained("g1", 100), drained("g2", 100), idle]
    assert [keeps_drain(n, same_second, config)[0] for n in same_second[:3]] == [False, True, True]
    earlier = [drained("g3", 99), drained("g1", 100), drained("g2", 100), idle]
    assert [keeps_drain(n, earlier, config)[0] for n in earlier[:3]] == [True, True, False]
    # A DOWN node and an admin's drain cannot give way: they come first.
    fixed = [NodeState("g1", "DOWN", "Not responding", ("gpu",), 5), drained("g2", 1, "ops"), drained("g3", 100), idle]
    assert keeps_drain(fixed[2], fixed, config)[0] is False


def test_sinfo_json_of_22_05_and_later_versions() -> None:
    old = {"name": "g1", "state": "idle", "state_flags": ["DRAIN"], "reason": "ops", "reason_changed_at": 7}
    new = {"name": "g2", "state": ["DOWN", "NOT_RESPONDING"], "reason": "", "reason_changed_at": {"set": False}}
    again = {**old, "partitions": ["all"]}
    nodes = parse_sinfo_json(json.dumps({"nodes": [{**old, "partitions": ["gpu"]}, new, again]}))
    assert nodes == [
        NodeState("g1", "IDLE+DRAIN", "ops", ("gpu", "all"), 7.0),
        NodeState("g2", "DOWN+NOT_RESPONDING", "", (), None),
    ]
    assert nodes[1].unusable and not nodes[1].drained


def test_the_slurm_config_names_its_binaries_and_reports_an_unknown_key() -> None:
    config, problems = parse_slurm({"sinfo": "/opt/slurm/bin/sinfo", "scontrol": "/opt/slurm/bin/scontrol"})
    assert (config.sinfo, config.scontrol, problems) == ("/opt/slurm/bin/sinfo", "/opt/slurm/bin/scontrol", [])
    _, problems = parse_slurm({"sinfo_binary": "sinfo"})
    assert len(problems) == 1 and "sinfo_binary" in problems[0]


def test_a_drain_whose_check_the_controller_did_not_answer_is_checked_on_the_next_run(tmp_path: Path) -> None:
    fake = FakeSlurm.of("g1", "g2", "g3")
    reads = []

    def gate() -> None:
        reads.append(1)
        if len(reads) == 2:  # g2 was drained (by gpumon there) after g1 read the partition, a second earlier
            fake.set("g2", flags=["DRAIN"], reason=REASON, time=int(fake.clock()) - 1)
        if len(reads) == 3:  # the controller stops answering before g1's check after its drain
            raise subprocess.TimeoutExpired(["sinfo"], 10)

    fake.read_gate = gate
    first = _act(FAULT, fake, tmp_path, max_drained_share=0.5)
    assert first.step == "unknown" and fake.drained() == {"g1", "g2"}
    fake.read_gate = None
    second = _act(FAULT, fake, tmp_path, max_drained_share=0.5)
    assert second.step == "refused" and "undone" in second.message
    assert fake.drained() == {"g2"}

"""What the daemon's NVML reads cost (issue 31): the calls that cost milliseconds of CPU are made at
intervals of their own, the PCIe throughput comes from counters instead of a call that samples, and
one-shot readers (gpumon burn, once, health) still get every field fresh."""

from __future__ import annotations

import pynvml

from gpumon.backends.fake import FakeBackend
from gpumon.backends.nvml import NvmlBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.collector import GpumonCollector
from gpumon.model.fields.clocks import VIOLATIONS_SECONDS
from gpumon.model.fields.gpm import GPM_SECONDS
from gpumon.model.fields.modes import FABRIC_SECONDS
from gpumon.model.fields.pcie import PCIE_SECONDS
from gpumon.model.fields.power import ENERGY_SECONDS
from gpumon.model.fields.topology import P2P_TOPOLOGY_SECONDS
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import Tier
from tests.fake_pynvml import FakeNvml

TX, RX = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES


def backend(fake: FakeNvml, now: list[float], *, spaced: bool) -> NvmlBackend:
    b = NvmlBackend(fake, clock=lambda: now[0], spaced=spaced)
    b.init()
    return b


def test_pcie_throughput_is_the_rate_of_the_byte_counters_with_no_call_that_samples(fake: FakeNvml) -> None:
    now = [0.0]
    b = backend(fake, now, spaced=True)
    assert "pcie_throughput_bytes_per_second" not in b.read(0, Tier.SLOW)  # no rate from one reading
    fake.gpus[0].pcie_bytes[TX] += 30_000_000_000
    fake.gpus[0].pcie_bytes[RX] += 60_000_000_000
    now[0] = PCIE_SECONDS
    assert b.read(0, Tier.SLOW)["pcie_throughput_bytes_per_second"] == {"tx": 1e9, "rx": 2e9}
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_a_pcie_counter_that_went_back_gives_no_rate(fake: FakeNvml) -> None:
    now = [0.0]
    b = backend(fake, now, spaced=False)
    b.read(0, Tier.SLOW)
    fake.gpus[0].pcie_bytes[TX] = 1_000  # the driver was reloaded
    fake.gpus[0].pcie_bytes[RX] += 5_000
    now[0] = 5.0
    assert b.read(0, Tier.SLOW)["pcie_throughput_bytes_per_second"] == {"rx": 1000.0}


def test_without_the_byte_counters_pcie_throughput_is_nvmls_sample(fake: FakeNvml) -> None:
    fake.gpus[0].pcie_bytes = {}
    got = backend(fake, [0.0], spaced=True).read(0, Tier.SLOW)
    assert got["pcie_throughput_bytes_per_second"] == {"tx": 1000 * 1024.0, "rx": 2000 * 1024.0}


def test_the_daemons_backend_reads_energy_violations_and_gpm_at_their_own_intervals(fake: FakeNvml) -> None:
    now = [0.0]
    b = backend(fake, now, spaced=True)
    energy, power = [], []
    samples_before = fake.calls["nvmlGpmSampleGet"]
    for _ in range(7):  # a slow read every 10 s for 60 s
        fake.gpus[0].energy_mj += 1_000_000  # 1 kJ every 10 s
        fake.gpus[0].violations_ns[0] += 1_000_000_000  # 1 s of power capping every 10 s
        got = b.read(0, Tier.SLOW)
        energy.append(got["energy_joules_total"])
        power.append(got["throttle_seconds_total"]["power"])
        now[0] += 10.0
    assert ENERGY_SECONDS == 60.0 and VIOLATIONS_SECONDS == 30.0 and GPM_SECONDS == 30.0
    assert len(set(energy)) == 2 and energy[0] == energy[5] < energy[6], energy  # asked at 0 s and 60 s
    assert len(set(power)) == 3 and power[0] == power[2] < power[3] == power[5] < power[6], power  # 0, 30, 60 s
    assert fake.calls["nvmlGpmSampleGet"] - samples_before == 3


def test_the_daemons_backend_reads_p2p_and_topology_once_an_hour(fake: FakeNvml) -> None:
    now = [0.0]
    b = backend(fake, now, spaced=True)
    for _ in range(12):  # a static read every 300 s for an hour
        b.read(0, Tier.STATIC)
        now[0] += 300.0
    asked = fake.calls["nvmlDeviceGetP2PStatus"]
    b.read(0, Tier.STATIC)  # 3600 s after the first
    assert P2P_TOPOLOGY_SECONDS == 3600.0
    assert asked > 0 and fake.calls["nvmlDeviceGetP2PStatus"] == 2 * asked, "asked at 0 s and at 3600 s only"


def test_one_shot_readers_ask_nvml_on_every_read(fake: FakeNvml) -> None:
    now = [0.0]
    b = backend(fake, now, spaced=False)
    first = b.read(0, Tier.SLOW)["energy_joules_total"]
    fake.gpus[0].energy_mj += 1_000_000
    assert b.read(0, Tier.SLOW)["energy_joules_total"] == first + 1000.0


def test_help_says_how_often_the_spaced_counters_refresh() -> None:
    store = SnapshotStore()
    Poller(FakeBackend.plausible(1, clock=lambda: 0.0), store).poll()
    text = GpumonCollector(store, PollIntervals(), monotonic=lambda: 5.0).render().decode()
    helps = {line.split()[2]: line for line in text.splitlines() if line.startswith("# HELP ")}
    assert helps["gpumon_energy_joules_total"].endswith("Refreshed every 60s.")
    assert helps["gpumon_tensor_active_ratio"].endswith("Refreshed every 30s.")
    assert helps["gpumon_nvlink_errors_total"].endswith("Refreshed every 300s.")


def test_the_daemons_backend_reads_nvlink_link_state_every_few_seconds_not_every_poll(fake: FakeNvml) -> None:
    """NVLink state per link was 80 % of NVML's CPU on 4 x H100 when read every second and 37 % at every
    5 s: the daemon reads it every NVLINK_STATE_SECONDS (30 s, dcgm-exporter's interval); gpumon once,
    health and burn's watcher still read it every time."""
    from gpumon.model.fields.nvlink import NVLINK_STATE_SECONDS

    now = [0.0]
    daemon, one_shot = backend(fake, now, spaced=True), backend(fake, now, spaced=False)
    daemon.read(0, Tier.FAST)
    asked = fake.calls["nvmlDeviceGetNvLinkState"]
    for _ in range(int(NVLINK_STATE_SECONDS) - 1):  # a poll every second, within the interval
        now[0] += 1.0
        assert daemon.read(0, Tier.FAST)["nvlink_up"]
    assert NVLINK_STATE_SECONDS == 30.0 and fake.calls["nvmlDeviceGetNvLinkState"] == asked
    now[0] += 1.0
    daemon.read(0, Tier.FAST)  # NVLINK_STATE_SECONDS after the first
    assert fake.calls["nvmlDeviceGetNvLinkState"] > asked
    before = fake.calls["nvmlDeviceGetNvLinkState"]
    one_shot.read(0, Tier.FAST)
    one_shot.read(0, Tier.FAST)
    assert fake.calls["nvmlDeviceGetNvLinkState"] > before + 1


def test_the_daemons_backend_reads_the_modes_every_minute_not_every_slow_read(fake: FakeNvml) -> None:
    """Persistence, MIG, compute and ECC mode change only by an administrator's hand: the daemon asks
    every MODES_SECONDS; its slow tier (every 10 s) keeps the last answer in between."""
    from gpumon.model.fields.modes import MODES_SECONDS

    calls = ("nvmlDeviceGetPersistenceMode", "nvmlDeviceGetMigMode", "nvmlDeviceGetComputeMode", "nvmlDeviceGetEccMode")
    now = [0.0]
    daemon, one_shot = backend(fake, now, spaced=True), backend(fake, now, spaced=False)
    first = daemon.read(0, Tier.SLOW)
    asked = {c: fake.calls[c] for c in calls}
    assert all(asked.values())
    for _ in range(int(MODES_SECONDS // 10) - 1):  # a slow read every 10 s, within the interval
        now[0] += 10.0
        again = daemon.read(0, Tier.SLOW)
        assert again["ecc_mode_enabled"] == first["ecc_mode_enabled"]
        assert again["persistence_mode_enabled"] == first["persistence_mode_enabled"]
    assert MODES_SECONDS == 60.0 and {c: fake.calls[c] for c in calls} == asked
    now[0] += 10.0
    daemon.read(0, Tier.SLOW)  # MODES_SECONDS after the first
    assert all(fake.calls[c] > asked[c] for c in calls)
    before = {c: fake.calls[c] for c in calls}
    one_shot.read(0, Tier.SLOW)
    assert all(fake.calls[c] > before[c] for c in calls)


def test_the_daemons_backend_reads_pcie_link_replays_bytes_and_fabric_every_30_s_not_every_slow_read(
    fake: FakeNvml,
) -> None:
    """Each of these calls cost 0.1-0.6 ms of CPU per GPU on 4 x H100, more than the whole fast tier
    together at every 10 s: the daemon asks every 30 s (dcgm-exporter's interval); a replay or a byte
    moved meanwhile shows at the next read (the counters are cumulative), and one-shot readers ask
    every time."""
    calls = (
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetGpuFabricInfo",
    )
    now = [0.0]
    daemon, one_shot = backend(fake, now, spaced=True), backend(fake, now, spaced=False)
    first = daemon.read(0, Tier.SLOW)
    asked = {c: fake.calls[c] for c in calls}
    assert all(asked.values()) and "fabric_state" in first
    fake.gpus[0].pcie_replays += 3
    for _ in range(2):  # slow reads at 10 s and 20 s
        now[0] += 10.0
        assert daemon.read(0, Tier.SLOW)["pcie_replays_total"] == first["pcie_replays_total"]
    assert PCIE_SECONDS == FABRIC_SECONDS == 30.0 and {c: fake.calls[c] for c in calls} == asked
    now[0] += 10.0
    assert daemon.read(0, Tier.SLOW)["pcie_replays_total"] == first["pcie_replays_total"] + 3  # at 30 s
    assert all(fake.calls[c] > asked[c] for c in calls)
    before = {c: fake.calls[c] for c in calls}
    one_shot.read(0, Tier.SLOW)
    assert all(fake.calls[c] > before[c] for c in calls)

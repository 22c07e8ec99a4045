"""Usage errors exit 2 and list every problem at once; importing the CLI never loads torch."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from gpumon.burn.orchestration.options import launch_from, parse_gpus, parse_tests
from gpumon.burn.workloads import inject


def test_every_usage_problem_is_listed_at_once_with_exit_2(burn):
    r = burn(["--device", "cpu", "--gpus", "0,7", "--tests", "matmul,fire", "--dtype", "int3"])
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert any("GPU 7 does not exist (this host has 2" in line for line in lines)
    assert any("unknown test 'fire'" in line for line in lines)
    assert any("unknown dtype 'int3'" in line for line in lines)
    assert "Traceback" not in r.err


def test_bad_fault_injection_is_a_usage_error(burn):
    r = burn(["--device", "cpu"], env={"GPUMON_BURN_INJECT": "explode:1"})
    assert r.code == 2
    assert "unknown fault 'explode'" in r.err


def test_nvml_missing_is_could_not_run_in_one_line(burn, tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("count: 2\nnvml_missing_inits: 5\n")
    r = burn(["--device", "cpu", "--backend", f"fake:{scenario}"])
    assert r.code == 3
    assert r.err.count("\n") == 1 and "NVML is not available" in r.err


def test_importing_the_cli_and_collector_does_not_import_torch():
    code = (
        "import sys, gpumon.burn.command, gpumon.exposition.burn_results; sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_multi_node_flags_need_a_master():
    _launch, problems = launch_from({}, nnodes=2, node_rank=0, master_addr=None, master_port=None)
    assert problems == ["--nnodes > 1 needs --master-addr and --master-port (the same on every node)"]


def test_torchrun_environment_is_detected():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    launch, problems = launch_from(env, 1, 0, None, None)
    assert problems == []
    assert (launch.mode, launch.agent_index, launch.agent_count, launch.node_index, launch.local_rank) == (
        "torchrun",
        3,
        4,
        1,
        1,
    )
    assert not launch.store_is_master and not launch.is_leader


@given(st.lists(st.integers(min_value=0, max_value=15), max_size=6), st.integers(min_value=1, max_value=8))
def test_gpu_lists_are_in_range_or_named_as_problems(indices, count):
    gpus, problems = parse_gpus(",".join(map(str, indices)), count)
    assert gpus is not None
    assert all(0 <= g < count for g in gpus)
    for g in set(indices):
        assert (g in gpus) or any(f"GPU {g}" in p for p in problems)


@given(st.text(max_size=40))
def test_gpu_and_test_parsers_never_raise(text):
    parse_gpus(text, 4)
    parse_tests(text)
    inject.parse(text)


def test_injection_parses_kinds_and_gpus():
    injection, problems = inject.parse("corrupt:1, slow:0,hang:1,oom:0")
    assert problems == []
    assert injection.has("corrupt", 1) and injection.has("hang", 1)
    assert injection.has("slow", 0) and injection.has("oom", 0)
    assert not injection.has("corrupt", 0)

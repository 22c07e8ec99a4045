"""The command line as a user meets it."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import bcrypt
import pytest

from gpumon import __version__
from tests.helpers import DaemonProcess, free_port, run_cli


def test_version_and_help() -> None:
    assert run_cli("--version").stdout.strip() == f"gpumon {__version__}"
    help_text = run_cli("--help").stdout
    for command in ("run", "once", "check-config"):
        assert command in help_text


@pytest.mark.parametrize(
    ("command", "summary", "option"),
    [
        ("run", "run the daemon", "--web-config-file"),
        ("once", "poll once", "--json"),
        ("check-config", "validate a config file", "file"),
        ("scenarios", "list the named fake-backend scenarios", "--help"),
        ("alerts", "show the active alerts", "--url"),
        ("burn", "burn-in and fault triage", "--quick"),
        ("hash-password", "print a bcrypt hash", "--stdin"),
        ("health", "node health verdict", "--slurm-prolog"),
    ],
)
def test_every_command_is_listed_and_has_its_own_help(command: str, summary: str, option: str) -> None:
    """``gpumon --help`` lists each command with its line; ``gpumon COMMAND --help`` shows its options
    (a command's module is imported only when that command is named)."""
    assert summary in " ".join(run_cli("--help").stdout.split())
    own = run_cli(command, "--help")
    assert own.returncode == 0, own.stderr
    assert own.stdout.startswith(f"usage: gpumon {command}")
    assert option in own.stdout


def test_python_dash_m_gpumon_works() -> None:
    result = subprocess.run([sys.executable, "-m", "gpumon", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and __version__ in result.stdout


def test_no_command_prints_help_and_exits_2() -> None:
    result = run_cli()
    assert result.returncode == 2 and "usage" in result.stdout


def test_once_prints_a_table_of_simulated_gpus() -> None:
    result = run_cli("once", "--backend", "fake", "--fake-gpus", "2")
    assert result.returncode == 0, result.stderr
    assert "NVIDIA H200" in result.stdout and "Driver 580.159.04" in result.stdout


def test_once_json_holds_every_gpu() -> None:
    result = run_cli("once", "--backend", "fake", "--fake-gpus", "2", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [g["index"] for g in data["gpus"]] == [0, 1]
    assert data["nvml_up"] is True
    assert data["gpus"][0]["memory_total_bytes"] > 100 * 2**30


def test_once_without_nvml_is_one_line_and_exit_1() -> None:
    """This machine has no NVIDIA driver: the real backend must say so in one line."""
    result = run_cli("once")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("gpumon: NVML unavailable"), result.stderr
    assert "Traceback" not in result.stderr


DAEMON_MODULES = """
import socket, sys, threading, time, os
from gpumon import cli

port, state_dir, backend = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if backend == "nvml":  # the real backend over two simulated H200s (tests/fake_pynvml.py)
    from tests.fake_pynvml import h200_pair
    sys.modules["pynvml"] = h200_pair()

def ask(path):
    with socket.socket() as conn:  # not create_connection: its getaddrinfo would load the IDNA codec
        conn.settimeout(5)
        conn.connect(("127.0.0.1", port))
        conn.sendall(f"GET {path} HTTP/1.0\\r\\n\\r\\n".encode())
        return b"".join(iter(lambda: conn.recv(65536), b""))

def report():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if b" 200 " in ask("/ready").split(b"\\r\\n")[0] and b"gpumon_gpu_" in ask("/metrics"):
                print(" ".join(sorted(sys.modules)), flush=True)
                os._exit(0)
        except OSError:
            pass
        time.sleep(0.1)
    os._exit(3)

threading.Thread(target=report, daemon=True).start()
cli.main(["run", "--backend", backend, "--fake-gpus", "1", "--listen", f"127.0.0.1:{port}", "--state-dir", state_dir])
"""


def modules_of_a_daemon(backend: str, state_dir: Path) -> set[str]:
    """The modules a ``gpumon run --backend BACKEND`` has loaded once it is ready and has served a scrape."""
    done = subprocess.run(
        [sys.executable, "-c", DAEMON_MODULES, str(free_port()), str(state_dir), backend],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    modules = set(done.stdout.split())
    assert "gpumon.daemon" in modules
    return modules


@pytest.fixture(scope="module")
def daemon_modules(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return modules_of_a_daemon("fake", tmp_path_factory.mktemp("state"))


@pytest.mark.parametrize(
    "module",
    [
        "torch",  # only `gpumon burn` uses it, in gpumon/burn/
        "rich",  # draws the tables of the one-shot commands (2.4 MiB)
        # posts alerts: with urllib3, idna, charset_normalizer ~110 modules, ~5 MiB; a daemon that has
        # sent none has not loaded it (test_delivery.py: a sender makes its session for its first batch)
        "requests",
        # the daemon writes its metrics itself; prometheus_client's package import loads its HTTP
        # servers and clients (~2 MiB); the tests render the same families with it as the reference
        "prometheus_client",
        "bcrypt",  # checks basic-auth passwords: loaded at the first check (0.5 MiB)
        "statistics",  # with fractions and decimal (0.6 MiB)
        # hmac, for basic auth's verdict cache: its hashlib initialises OpenSSL's digests, which
        # makes 0.4 MiB more of libcrypto resident than ssl alone does
        "hashlib",
        # binding the listener to a name given as str loads the IDNA codec, with unicodedata
        "encodings.idna",
        # the other commands' modules: main() imports only the command it runs
        "gpumon.burn.command",
        "gpumon.commands.alerts",
        "gpumon.commands.hash_password",
        "getpass",  # gpumon health clear's user name (getpass loads termios)
        # TLS, basic auth and the web config's reader: only with --web-config-file
        "gpumon.http.webconfig",
        "gpumon.http.tls",
        "gpumon.http.basic_auth",
        "gpumon.exposition.dcgm",  # dcgm-exporter's names: only with --compat dcgm
        "gzip",  # gzip responses are written with zlib (gpumon.exposition.gzip_parts)
    ],
)
def test_the_daemon_does_not_load(module: str, daemon_modules: set[str]) -> None:
    assert module not in daemon_modules


def test_a_daemon_on_real_gpus_does_not_load_the_fake_backend(tmp_path: Path) -> None:
    modules = modules_of_a_daemon("nvml", tmp_path)
    assert "gpumon.backends.nvml" in modules
    assert "gpumon.backends.fake" not in modules
    assert "gpumon.backends.scenario" not in modules


# --- one --json convention: --json / --json - print to stdout, --json PATH writes a file -----------


def test_once_json_dash_is_stdout_and_json_path_writes_a_file(tmp_path: Path) -> None:
    dash = run_cli("once", "--backend", "fake", "--fake-gpus", "1", "--json", "-")
    assert dash.returncode == 0, dash.stderr
    assert json.loads(dash.stdout)["nvml_up"] is True
    report = tmp_path / "once.json"
    to_file = run_cli("once", "--backend", "fake", "--fake-gpus", "1", "--json", str(report))
    assert to_file.returncode == 0, to_file.stderr
    assert "NVIDIA H200" in to_file.stdout, "with a PATH the table is printed as usual"
    assert [g["index"] for g in json.loads(report.read_text())["gpus"]] == [0]


def test_once_json_into_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli("once", "--backend", "fake", "--fake-gpus", "1", "--json", str(tmp_path / "no" / "x.json"))
    assert result.returncode == 2
    assert result.stderr.startswith("gpumon: cannot write --json") and "Traceback" not in result.stderr


def test_alerts_json_follows_the_same_convention(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    daemon = start_daemon("--backend", "fake:healthy")  # a steady scenario: no alert comes and goes
    for flag in (["--json"], ["--json", "-"]):
        result = run_cli("alerts", "--url", daemon.url, *flag)
        assert result.returncode == 0, result.stderr
        assert "alerts" in json.loads(result.stdout)
    report = tmp_path / "alerts.json"
    result = run_cli("alerts", "--url", daemon.url, "--json", str(report))
    assert result.returncode == 0, result.stderr
    assert "alerts" in json.loads(report.read_text()) and "No active alerts" in result.stdout


@pytest.mark.slow
def test_burn_json_dash_prints_the_report_on_stdout_not_a_file_named_dash(tmp_path: Path) -> None:
    args = ["burn", "--device", "cpu", "--backend", "fake", "--tests", "sw", "--gpus", "0", "--json", "-"]
    result = subprocess.run(
        [sys.executable, "-m", "gpumon", *args, "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=150, cwd=tmp_path,
    )  # fmt: skip
    assert not (tmp_path / "-").exists(), "--json - must not write a file named -"
    report = json.loads(result.stdout)  # stdout holds the JSON only; the human report went to stderr
    assert report["exit_code"] == result.returncode
    assert "verdict" in report and "verdict" in result.stderr.lower()


# --- gpumon hash-password ----------------------------------------------------------------------


def test_hash_password_from_stdin_prints_a_bcrypt_hash_that_verifies() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpumon", "hash-password", "--stdin"],
        input="s3cret pass\n", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    hashed = result.stdout.strip()
    assert result.stdout.count("\n") == 1 and hashed.startswith("$2")
    assert bcrypt.checkpw(b"s3cret pass", hashed.encode())
    assert not bcrypt.checkpw(b"s3cret pass\n", hashed.encode()), "the line's newline is not part of the password"
    assert "s3cret" not in result.stdout + result.stderr


def test_hash_password_is_accepted_by_the_web_config(tmp_path: Path) -> None:
    hashed = subprocess.run(
        [sys.executable, "-m", "gpumon", "hash-password", "--stdin"], input="pw\n", capture_output=True, text=True
    ).stdout.strip()
    web = tmp_path / "web-config.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    config = tmp_path / "gpumon.yaml"
    config.write_text(f"web_config_file: {web}\n")
    result = run_cli("check-config", str(config))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("stdin", "why"),
    [("\n", "empty"), ("", "no password"), ("x" * 73 + "\n", "72 bytes")],
    ids=["empty", "eof", "long"],
)
def test_hash_password_refuses_unusable_passwords(stdin: str, why: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpumon", "hash-password", "--stdin"], input=stdin, capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stdout == ""
    assert why in result.stderr and "Traceback" not in result.stderr


def test_hash_password_without_a_terminal_asks_for_stdin() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpumon", "hash-password"], input="pw\n", capture_output=True, text=True
    )
    assert result.returncode == 2 and "--stdin" in result.stderr and result.stdout == ""


def _run_on_a_terminal(args: list[str], answers: list[str]) -> tuple[int, str]:
    """Run ``python -m gpumon ARGS`` with a pseudo-terminal as its controlling terminal; answer each prompt."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin/stdout/stderr and /dev/tty are the terminal
        os.execv(sys.executable, [sys.executable, "-m", "gpumon", *args])
    seen = b""
    answered = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
        # answer each prompt once it is complete (getpass discards what was typed before its prompt)
        if answered < len(answers) and seen.count(b"Password") > answered and seen.endswith(b": "):
            os.write(fd, (answers[answered] + "\n").encode())
            answered += 1
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), seen.decode(errors="replace")


def test_hash_password_on_a_terminal_asks_twice_and_never_echoes() -> None:
    code, screen = _run_on_a_terminal(["hash-password"], ["tty-secret", "tty-secret"])
    assert code == 0, screen
    assert "Password:" in screen and "Password again:" in screen
    assert "tty-secret" not in screen, "the password must not be echoed"
    hashed = screen.strip().splitlines()[-1].strip()
    assert bcrypt.checkpw(b"tty-secret", hashed.encode())


def test_hash_password_on_a_terminal_refuses_two_different_answers() -> None:
    code, screen = _run_on_a_terminal(["hash-password"], ["one", "two"])
    assert code == 2 and "do not match" in screen and "$2" not in screen


# --- named scenarios ---------------------------------------------------------------------------

NAMED = ["gpu-lost", "healthy", "nvlink-degraded", "nvml-missing", "overheating", "straggler", "xid-storm"]


def test_scenarios_lists_every_named_scenario_with_a_description() -> None:
    result = run_cli("scenarios")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line and line.split()[0] in NAMED]
    assert [line.split()[0] for line in lines] == NAMED
    assert all(len(line.split(None, 1)[1]) > 20 for line in lines), "each has a one-line description"
    assert "--backend fake:NAME" in result.stdout


def test_once_plays_a_named_scenario() -> None:
    result = run_cli("once", "--backend", "fake:straggler", "--json")
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)["gpus"]
    assert len(gpus) == 4 and gpus[2]["clock_events_active"]["hw_slowdown"] is True


def test_an_unknown_scenario_name_is_a_usage_error_that_lists_the_names() -> None:
    result = run_cli("once", "--backend", "fake:gpu-lots")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "gpu-lost" in result.stderr and "gpumon scenarios" in result.stderr

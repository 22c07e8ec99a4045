"""Configuration: YAML file + GPUMON_* environment + flags -> one frozen Config.

Precedence is flags > environment > file > defaults. Every problem is collected and
reported at once (``ConfigError.problems``); nothing starts half-configured.

``load`` is the one gate: ``gpumon check-config``, ``gpumon run`` and the SIGHUP reload all call
it, it reads the files the config names (web config, scenario) with the code ``run`` uses, and
it raises nothing but ConfigError whatever the files hold (bytes that are not UTF-8, nesting,
alias bombs, numbers of any size: see gpumon.util.yamlfile). Every number has a finite range, which
the problem line states (``SECONDS_RANGES``, ``MAX_FAKE_GPUS``, and those of the sections).

Top-level scalar keys map to environment variables by upper-casing them:
``interval_seconds`` <- ``GPUMON_INTERVAL_SECONDS``. Sections (``alerting``,
``exporter``, ``xid``) are validated by the module that owns them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpumon.config.checks import named_path_problems, validate_backend, validate_listen, web_config_problems
from gpumon.config.exporter import EXPORTER_KEYS, ExporterConfig, parse_exporter, set_exporter_checked
from gpumon.config.scalars import convert
from gpumon.util.yamlfile import MAX_FILE_BYTES, YamlFileError, brief, read_yaml

if TYPE_CHECKING:
    from gpumon.alerts.config import AlertingConfig
    from gpumon.health.config import HealthConfig

DEFAULT_PORT = 10480
"""gpumon's port. Prometheus' exporter range 9100-9999 is fully allocated (dcgm-exporter
has 9400, nvidia_gpu_exporter 9835), so gpumon sits just outside it."""
DEFAULT_CONFIG_PATH = Path("/etc/gpumon/gpumon.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/gpumon")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """The configuration has problems; ``problems`` lists each one as a line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Config:
    """Everything gpumon run needs, validated."""

    listen: str = f"0.0.0.0:{DEFAULT_PORT}"
    backend: str = "nvml"
    """``nvml``, ``fake`` (with fake_gpus), ``fake:NAME`` (a named scenario) or ``fake:PATH`` (a scenario file)."""
    fake_gpus: int = 2
    """GPUs of ``backend: fake``, 0-4096."""
    interval_seconds: float = 1.0
    """Fast tier, 0.1-3600 s: utilization, memory, temperature, power, clocks, processes."""
    slow_interval_seconds: float = 10.0
    """Slow tier, 0.1-86400 s and not shorter than the fast one: energy, ECC, violation counters,
    PCIe throughput, error counters."""
    static_interval_seconds: float = 300.0
    """Static tier, 0.1-86400 s: identity, max clocks, thresholds, P2P and topology."""
    stale_after_seconds: float = 0.0
    """Snapshot age after which /ready fails, 0.1-86400 s and not shorter than interval_seconds;
    0 means 5 × interval_seconds."""
    state_dir: Path = DEFAULT_STATE_DIR
    log_level: str = "info"
    web_config_file: Path | None = None
    """Prometheus exporter-toolkit web-config.yml for TLS and basic auth."""
    kernel_log: bool = True
    """Follow the kernel log for XIDs (from boot, for as long as the daemon runs), beside NVML events."""
    exporter: ExporterConfig = field(default_factory=ExporterConfig)
    alerting: AlertingConfig | None = None
    """The validated ``alerting:`` section (defaults when absent); None only in hand-built Configs."""
    xid_catalog: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    """Overrides of the shipped XID catalog: code -> {meaning, severity, action}."""
    health: HealthConfig | None = None
    """The validated ``health:`` section (verdict, inventory, XID lifecycle, Slurm); None only in hand-built Configs."""
    source: str | None = None
    """The file this came from, if any."""

    @property
    def stale_after(self) -> float:
        return self.stale_after_seconds or 5 * self.interval_seconds

    def listen_address(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "0.0.0.0", int(port)


_NOT_CONFIGURATION = frozenset({"strict_fields", "burn_inject", "burn_floors"})
"""GPUMON_* variables that are not configuration: GPUMON_STRICT_FIELDS=1 makes the poller raise on a field
name no GpuSnapshot declares (the test suite sets it, so a reader's typo fails a test); GPUMON_BURN_INJECT
and GPUMON_BURN_FLOORS are gpumon burn's own (a Slurm epilog that starts a burn may carry them)."""

_SCALARS: dict[str, type] = {
    "listen": str,
    "backend": str,
    "fake_gpus": int,
    "interval_seconds": float,
    "slow_interval_seconds": float,
    "static_interval_seconds": float,
    "stale_after_seconds": float,
    "state_dir": Path,
    "log_level": str,
    "web_config_file": Path,
    "kernel_log": bool,
}
_SECTIONS = ("exporter", "alerting", "xid_catalog", "health")

SECONDS_RANGES: Mapping[str, tuple[float, float]] = {
    "interval_seconds": (0.1, 3600.0),
    "slow_interval_seconds": (0.1, 86400.0),
    "static_interval_seconds": (0.1, 86400.0),
    "stale_after_seconds": (0.1, 86400.0),
}
"""The range of each interval setting, in seconds (stale_after_seconds may also be 0: 5 × interval_seconds)."""
MAX_FAKE_GPUS = 4096


def _parse_xid_catalog(raw: Any, problems: list[str], where: str) -> dict[int, dict[str, str]]:
    """Overrides of the shipped XID catalog, validated by gpumon.model.xid_catalog."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: xid_catalog must be a mapping of XID code to {{meaning, severity, action}}")
        return {}
    from gpumon.model.xid_catalog import normalize_overrides, override_problems

    found = override_problems(raw, f"{where}: xid_catalog")
    problems.extend(found)
    if found:
        return {}
    return normalize_overrides(raw)


def _parse_alerting(raw: Any, problems: list[str], where: str) -> AlertingConfig | None:
    """Delegated to gpumon.alerts.config, which owns the alerting section."""
    from gpumon.alerts import config as alerts_config

    parsed, section_problems = alerts_config.parse(raw)
    problems.extend(f"{where}: {p}" for p in section_problems)
    return parsed


def _parse_health(raw: Any, problems: list[str], where: str) -> HealthConfig:
    """Delegated to gpumon.health.config, which owns the health section."""
    from gpumon.health.config import parse_health

    parsed, section_problems = parse_health(raw)
    problems.extend(f"{where}: {p}" for p in section_problems)
    return parsed


def _apply(values: dict[str, Any], raw: Mapping[Any, Any], where: str, problems: list[str], sections: bool) -> None:
    for key, value in raw.items():
        if key in _SCALARS:
            if value is None:
                continue
            converted = convert(key, value, _SCALARS[key], problems, where)
            if converted is not None:
                values[key] = converted
        elif sections and key in _SECTIONS:
            values[key] = value
        else:
            problems.append(f"{where}: unknown key {brief(key)}")


def _read_file(path: Path, must_exist: bool, problems: list[str]) -> dict[Any, Any] | None:
    if not must_exist and not os.path.lexists(path):
        return None
    try:
        raw = read_yaml(path)
    except YamlFileError as exc:
        problems.extend(exc.problems)
        if not isinstance(exc.document, dict):
            return None
        raw = exc.document  # a key given twice: the file's other problems are listed too
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{path}: the top level must be a mapping of keys to values, got {brief(raw)}")
        return None
    return raw


def _check_values(values: dict[str, Any], where: str, problems: list[str]) -> None:
    """Ranges and relations of the scalar settings; each message gives the range."""
    if "listen" in values:
        validate_listen(values["listen"], problems, where)
    if "backend" in values:
        validate_backend(values["backend"], problems, where)
    for key, (low, high) in SECONDS_RANGES.items():
        if key not in values:
            continue
        value = values[key]
        if key == "stale_after_seconds" and value == 0:
            continue
        if not low <= value <= high:
            zero = "0 (5 × interval_seconds) or " if key == "stale_after_seconds" else ""
            problems.append(f"{where}: {key} must be {zero}from {low:g} to {high:g} seconds, got {brief(value)}")
            values.pop(key)
    if "fake_gpus" in values and not 0 <= values["fake_gpus"] <= MAX_FAKE_GPUS:
        problems.append(f"{where}: fake_gpus must be from 0 to {MAX_FAKE_GPUS}, got {values['fake_gpus']}")
    if "log_level" in values and values["log_level"] not in LOG_LEVELS:
        problems.append(f"{where}: log_level must be one of {', '.join(LOG_LEVELS)}, got {brief(values['log_level'])}")
    if "web_config_file" in values:
        web = values["web_config_file"]
        if not web.exists():
            problems.append(f"{where}: web_config_file {brief(str(web))} does not exist")
        else:
            problems.extend(web_config_problems(web))
    interval = values.get("interval_seconds", Config.interval_seconds)
    if values.get("slow_interval_seconds", Config.slow_interval_seconds) < interval:
        problems.append(f"{where}: slow_interval_seconds must not be shorter than interval_seconds")
    stale = values.get("stale_after_seconds", 0.0)
    if stale and stale < interval:
        problems.append(f"{where}: stale_after_seconds must be 0 or at least interval_seconds ({interval:g} s)")


def load(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    path_must_exist: bool = False,
) -> Config:
    """Build the Config and check everything it names; raise ConfigError listing every problem.

    This is the one gate: ``gpumon check-config``, ``gpumon run`` and its reload (SIGHUP) all call
    it, so what ``run`` would reject, ``check-config`` rejects first. Besides the file itself it reads
    the files the config names (the web config, a ``fake:PATH`` scenario) with the same code ``run``
    uses. It raises nothing but ConfigError, whatever the files hold.

    ``path`` None means the default file when it exists. ``flags`` holds only the
    options the user actually gave on the command line.
    """
    problems: list[str] = []
    values: dict[str, Any] = {}
    source: str | None = None
    readable = False
    if path is None and DEFAULT_CONFIG_PATH.exists():
        path = DEFAULT_CONFIG_PATH
    if path is not None:
        source = str(path)
        raw = _read_file(Path(path), path_must_exist or path != DEFAULT_CONFIG_PATH, problems)
        readable = raw is not None
        if raw:
            _apply(values, raw, source, problems, sections=True)
    _apply_environment(values, os.environ if env is None else env, problems)
    if flags:
        _apply_flags(values, flags, problems)
    checked: list[str] = []
    _check_values(values, source or "config", checked)
    problems.extend(_attributed(checked, source or "config", _origins(os.environ if env is None else env, flags)))
    _parse_sections(values, source or "config", problems)
    if problems:
        problems = _suggested(problems)
        raise ConfigError(_located(problems, source) if readable else problems)
    known = {f.name for f in fields(Config)}
    return replace(Config(), source=source, **{k: v for k, v in values.items() if k in known})


def _apply_environment(values: dict[str, Any], env: Mapping[str, str], problems: list[str]) -> None:
    """The ``GPUMON_*`` variables over the file's values: scalars by their upper-cased names, the
    exporter's as ``GPUMON_EXPORTER_<KEY>``; any other ``GPUMON_*`` variable is a problem."""
    env_raw = {}
    exporter: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith("GPUMON_"):
            continue
        key = name[len("GPUMON_") :].lower()
        if key in _SCALARS:
            env_raw[key] = value
        elif key.startswith("exporter_") and key[len("exporter_") :] in EXPORTER_KEYS:
            exporter[key[len("exporter_") :]] = value
        elif key in _NOT_CONFIGURATION:
            continue
        else:
            problems.append(f"environment: unknown variable {brief(name)}")
    names = {key: f"GPUMON_EXPORTER_{key.upper()}" for key in exporter}
    set_exporter_checked(values, exporter, "environment", names, problems)
    _apply(values, env_raw, "environment", problems, sections=False)


def _apply_flags(values: dict[str, Any], flags: Mapping[str, Any], problems: list[str]) -> None:
    """The options given on the command line over the environment and the file."""
    flag_values = {k: v for k, v in flags.items() if k in _SCALARS and v is not None}
    _apply(values, flag_values, "command line", problems, sections=False)
    exporter = {key: flags[key] for key in _EXPORTER_FLAGS if flags.get(key) is not None}
    if flags.get("processes"):
        exporter["processes"] = True
    set_exporter_checked(values, exporter, "command line", _EXPORTER_FLAGS, problems)


_EXPORTER_FLAGS = {
    "compat": "--compat",
    "compat_hostname_label": "--compat-hostname-label",
    "compat_labels": "--compat-labels",
    "processes": "--processes",
}
"""The exporter settings gpumon run takes as options: key -> the option."""


def _suggested(problems: list[str]) -> list[str]:
    """Each unknown key or variable with the known one closest to it (gpumon.config.suggest)."""
    from gpumon.alerts.rule_config import _RULE_KEYS as rule_keys
    from gpumon.config.suggest import with_suggestions

    variables = [f"GPUMON_{k.upper()}" for k in _SCALARS] + [f"GPUMON_EXPORTER_{k.upper()}" for k in EXPORTER_KEYS]
    return with_suggestions(problems, [*_SCALARS, *_SECTIONS], rule_keys, variables)


def _origins(env: Mapping[str, str], flags: Mapping[str, Any] | None) -> dict[str, str]:
    """Setting -> how the user gave it, for those not from the file: ``--listen``, ``GPUMON_LISTEN``."""
    given = {n[len("GPUMON_") :].lower(): n for n in env if n.startswith("GPUMON_") and n[7:].lower() in _SCALARS}
    given.update({k: "--" + k.replace("_", "-") for k, v in (flags or {}).items() if k in _SCALARS and v is not None})
    return given


def _attributed(problems: list[str], where: str, origins: Mapping[str, str]) -> list[str]:
    """``problems`` about a setting the environment or the command line gave said as theirs
    (``command line: --listen must be ...``), not the file's."""
    out = []
    for problem in problems:
        key = problem.removeprefix(f"{where}: ").split(" ", 1)[0]
        if problem.startswith(f"{where}: ") and key in origins:
            origin = "command line" if origins[key].startswith("--") else "environment"
            problem = f"{origin}: {origins[key]}" + problem[len(where) + 2 + len(key) :]
        out.append(problem)
    return out


def _parse_sections(values: dict[str, Any], where: str, problems: list[str]) -> None:
    """Each section's raw value replaced by its validated form (each read by the module that owns it)."""
    values["exporter"] = parse_exporter(values.get("exporter"), problems, where)
    values["xid_catalog"] = _parse_xid_catalog(values.get("xid_catalog"), problems, where)
    values["alerting"] = _parse_alerting(values.get("alerting"), problems, where)
    values["health"] = _parse_health(values.get("health"), problems, where)
    problems.extend(named_path_problems(values.get("state_dir"), values["health"], values["alerting"], where))


def _located(problems: list[str], source: str | None) -> list[str]:
    """``problems`` with the line and column of the setting in the file each one is about, where it has one."""
    if source is None:
        return problems
    try:  # a regular file of a config's size only: never a FIFO, a device or a huge file read again
        if not Path(source).is_file() or Path(source).stat().st_size > MAX_FILE_BYTES:
            return problems
        with open(source, "rb") as f:
            text = f.read(MAX_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError):
        return problems
    from gpumon.config.positions import with_positions

    return with_positions(problems, source, text)


def reloader(
    path: Path | None, flags: Mapping[str, Any], env: Callable[[], Mapping[str, str]] = lambda: os.environ
) -> Callable[[], Config]:
    """A function that re-reads the same sources (for SIGHUP)."""
    return lambda: load(path, env(), flags)

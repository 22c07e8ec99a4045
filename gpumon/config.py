"""Configuration: YAML file + GPUMON_* environment + flags -> one frozen Config.

Precedence is flags > environment > file > defaults. Every problem is collected and
reported at once (``ConfigError.problems``); nothing starts half-configured.

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

import yaml

if TYPE_CHECKING:
    from gpumon.alerts.config import AlertingConfig
    from gpumon.findings.config import HealthConfig

DEFAULT_PORT = 10480
"""gpumon's port. Prometheus' exporter range 9100-9999 is fully allocated (dcgm-exporter
has 9400, nvidia_gpu_exporter 9835), so gpumon sits just outside it."""
DEFAULT_CONFIG_PATH = Path("/etc/gpumon/gpumon.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/gpumon")
LOG_LEVELS = ("debug", "info", "warning", "error")
COMPAT_MODES = ("dcgm",)


class ConfigError(Exception):
    """The configuration has problems; ``problems`` lists each one as a line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class ExporterConfig:
    """What /metrics serves beyond the contract."""

    processes: bool = False
    """Per-process series (gpumon_process_*); off by default for cardinality."""
    compat: tuple[str, ...] = ()
    """Extra name sets; ``dcgm`` adds dcgm-exporter's DCGM_FI_* names."""


@dataclass(frozen=True)
class Config:
    """Everything gpumon run needs, validated."""

    listen: str = f"0.0.0.0:{DEFAULT_PORT}"
    backend: str = "nvml"
    """``nvml``, ``fake`` (with fake_gpus), ``fake:NAME`` (a named scenario) or ``fake:PATH`` (a scenario file)."""
    fake_gpus: int = 2
    interval_seconds: float = 1.0
    """Fast tier: utilization, memory, temperature, power, clocks, processes."""
    slow_interval_seconds: float = 10.0
    """Slow tier: energy, ECC, violation counters, PCIe throughput, error counters."""
    static_interval_seconds: float = 300.0
    """Static tier: identity, max clocks, thresholds, P2P and topology."""
    stale_after_seconds: float = 0.0
    """Snapshot age after which /ready fails; 0 means 5 × interval_seconds."""
    state_dir: Path = DEFAULT_STATE_DIR
    log_level: str = "info"
    web_config_file: Path | None = None
    """Prometheus exporter-toolkit web-config.yml for TLS and basic auth."""
    kernel_log: bool = True
    """Read XIDs from the kernel log at start."""
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


def _convert(name: str, value: Any, want: type, problems: list[str], where: str) -> Any:
    try:
        if want is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return value.lower() in ("1", "true", "yes", "on")
            raise ValueError
        if want is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if want is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if want is Path:
            if not isinstance(value, (str, Path)) or not str(value):
                raise ValueError
            return Path(value)
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError):
        problems.append(f"{where}: {name} must be {want.__name__.lower()}, got {value!r}")
        return None


def _validate_listen(value: str, problems: list[str], where: str) -> None:
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        problems.append(f"{where}: listen must be HOST:PORT with a port 1-65535, got {value!r}")


def _validate_backend(value: str, problems: list[str], where: str) -> None:
    if value in ("nvml", "fake"):
        return
    if value.startswith("fake:") and len(value) > 5:
        from gpumon.backends import scenarios

        target = value[5:]
        if scenarios.path_of(target) is None and not Path(target).is_file():
            problems.append(
                f"{where}: backend {value!r}: no scenario file {target!r} and no named scenario of that name "
                f"({', '.join(scenarios.names())}; gpumon scenarios describes them)"
            )
        return
    problems.append(f"{where}: backend must be nvml, fake, fake:NAME or fake:PATH, got {value!r}")


def _parse_exporter(raw: Any, problems: list[str], where: str) -> ExporterConfig:
    if raw is None:
        return ExporterConfig()
    if not isinstance(raw, dict):
        problems.append(f"{where}: exporter must be a mapping")
        return ExporterConfig()
    for key in raw:
        if key not in ("processes", "compat"):
            problems.append(f"{where}: unknown key exporter.{key}")
    processes = _convert("exporter.processes", raw.get("processes", False), bool, problems, where)
    compat_raw = raw.get("compat", [])
    if isinstance(compat_raw, str):
        compat_raw = [c for c in compat_raw.split(",") if c]
    compat: list[str] = []
    if not isinstance(compat_raw, list):
        problems.append(f"{where}: exporter.compat must be a list")
    else:
        for c in compat_raw:
            if c not in COMPAT_MODES:
                problems.append(f"{where}: exporter.compat: unknown mode {c!r} (known: {', '.join(COMPAT_MODES)})")
            else:
                compat.append(c)
    return ExporterConfig(processes=bool(processes), compat=tuple(compat))


def _parse_xid_catalog(raw: Any, problems: list[str], where: str) -> dict[int, dict[str, str]]:
    """Overrides of the shipped XID catalog, validated by gpumon.events.catalog."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: xid_catalog must be a mapping of XID code to {{meaning, severity, action}}")
        return {}
    from gpumon.events.catalog import override_problems

    found = override_problems(raw, f"{where}: xid_catalog")
    problems.extend(found)
    if found:
        return {}
    return {int(code): {k: str(v) for k, v in entry.items()} for code, entry in raw.items()}


def _parse_alerting(raw: Any, problems: list[str], where: str) -> AlertingConfig | None:
    """Delegated to gpumon.alerts.config, which owns the alerting section."""
    from gpumon.alerts import config as alerts_config

    parsed, section_problems = alerts_config.parse(raw)
    problems.extend(f"{where}: {p}" for p in section_problems)
    return parsed


def _parse_health(raw: Any, problems: list[str], where: str) -> HealthConfig:
    """Delegated to gpumon.findings.config, which owns the health section."""
    from gpumon.findings.config import parse_health

    parsed, section_problems = parse_health(raw)
    problems.extend(f"{where}: {p}" for p in section_problems)
    return parsed


def _apply(values: dict[str, Any], raw: Mapping[str, Any], where: str, problems: list[str], sections: bool) -> None:
    for key, value in raw.items():
        if key in _SCALARS:
            if value is None:
                continue
            converted = _convert(key, value, _SCALARS[key], problems, where)
            if converted is not None:
                values[key] = converted
        elif sections and key in _SECTIONS:
            values[key] = value
        else:
            problems.append(f"{where}: unknown key {key!r}")


def load(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    path_must_exist: bool = False,
) -> Config:
    """Build the Config; raise ConfigError listing every problem.

    ``path`` None means the default file when it exists. ``flags`` holds only the
    options the user actually gave on the command line.
    """
    problems: list[str] = []
    values: dict[str, Any] = {}
    source: str | None = None
    if path is None and DEFAULT_CONFIG_PATH.exists():
        path = DEFAULT_CONFIG_PATH
    if path is not None:
        source = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raw = None
            if path_must_exist or path != DEFAULT_CONFIG_PATH:
                problems.append(f"{path}: no such file")
        except OSError as exc:
            raw = None
            problems.append(f"{path}: cannot read: {exc.strerror}")
        except yaml.YAMLError as exc:
            raw = None
            problems.append(f"{path}: not valid YAML: {exc}")
        if raw is not None and not isinstance(raw, dict):
            problems.append(f"{path}: the top level must be a mapping of keys to values")
        elif raw:
            _apply(values, raw, str(path), problems, sections=True)

    env = os.environ if env is None else env
    env_raw = {}
    for name, value in env.items():
        if not name.startswith("GPUMON_"):
            continue
        key = name[len("GPUMON_") :].lower()
        if key in _SCALARS:
            env_raw[key] = value
        elif key == "exporter_compat":
            values["exporter"] = {**(values.get("exporter") or {}), "compat": value}
        elif key == "exporter_processes":
            values["exporter"] = {**(values.get("exporter") or {}), "processes": value}
        else:
            problems.append(f"environment: unknown variable {name}")
    _apply(values, env_raw, "environment", problems, sections=False)
    if flags:
        flag_values = {k: v for k, v in flags.items() if k in _SCALARS and v is not None}
        _apply(values, flag_values, "command line", problems, sections=False)
        if flags.get("compat") is not None:
            values["exporter"] = {**(values.get("exporter") or {}), "compat": flags["compat"]}
        if flags.get("processes"):
            values["exporter"] = {**(values.get("exporter") or {}), "processes": True}

    where = source or "config"
    if "listen" in values:
        _validate_listen(values["listen"], problems, where)
    if "backend" in values:
        _validate_backend(values["backend"], problems, where)
    for key in ("interval_seconds", "slow_interval_seconds", "static_interval_seconds"):
        if key in values and not values[key] > 0:
            problems.append(f"{where}: {key} must be greater than 0, got {values[key]}")
    if "stale_after_seconds" in values and values["stale_after_seconds"] < 0:
        problems.append(f"{where}: stale_after_seconds must not be negative")
    if "fake_gpus" in values and not 0 <= values["fake_gpus"] <= 4096:
        problems.append(f"{where}: fake_gpus must be between 0 and 4096, got {values['fake_gpus']}")
    if "log_level" in values and values["log_level"] not in LOG_LEVELS:
        problems.append(f"{where}: log_level must be one of {', '.join(LOG_LEVELS)}, got {values['log_level']!r}")
    if "web_config_file" in values and not values["web_config_file"].is_file():
        problems.append(f"{where}: web_config_file {str(values['web_config_file'])!r} does not exist")
    interval = values.get("interval_seconds", 1.0)
    if values.get("slow_interval_seconds", 10.0) < interval:
        problems.append(f"{where}: slow_interval_seconds must not be shorter than interval_seconds")

    values["exporter"] = _parse_exporter(values.get("exporter"), problems, where)
    values["xid_catalog"] = _parse_xid_catalog(values.get("xid_catalog"), problems, where)
    values["alerting"] = _parse_alerting(values.get("alerting"), problems, where)
    values["health"] = _parse_health(values.get("health"), problems, where)
    if problems:
        raise ConfigError(problems)
    known = {f.name for f in fields(Config)}
    return replace(Config(), source=source, **{k: v for k, v in values.items() if k in known})


def reloader(
    path: Path | None, flags: Mapping[str, Any], env: Callable[[], Mapping[str, str]] = lambda: os.environ
) -> Callable[[], Config]:
    """A function that re-reads the same sources (for SIGHUP)."""
    return lambda: load(path, env(), flags)

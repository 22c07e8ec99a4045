"""``gpumon bundle``: one archive to attach to a bug report, that ``--backend replay:`` plays back.

``gpumon-bundle-<host>-<UTC time>.tar.gz`` holds:

* ``recording.json``: a ``gpumon record`` of this host (5 polls by default; serials, UUIDs and process
  ids redacted unless ``--no-redact``), which ``gpumon once --backend replay:THE.tar.gz`` plays;
* ``config.yaml``: the configuration file with its secrets removed (every value under a key that
  names a password, token, secret, key, credential, header or cookie; every URL cut to its scheme,
  host and port), or a note of why it could not be read;
* ``health/``: the state directory's health files (inventory baseline, XID lifecycle, clears, action log);
* ``burn-last.json``: the last ``gpumon burn`` report;
* ``facts.json``: gpumon, Python, nvidia-ml-py, the kernel, the driver (/proc/driver/nvidia/version),
  and what went wrong while bundling (NVML unavailable, a file unreadable): a bundle is written anyway.

Nothing else of the host is read; the web config (password hashes, TLS keys) is left out.
Exit 0 written, 2 the archive cannot be written.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import platform
import re
import socket
import sys
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpumon import __version__
from gpumon.backends.recording import BUNDLE_MEMBER
from gpumon.commands.record import RecordRequest, poll_interval_seconds, polls_count, record

EXIT_OK = 0
EXIT_USAGE = 2
DEFAULT_CONFIG = Path("/etc/gpumon/gpumon.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/gpumon")
MAX_FILE_BYTES = 4 * 1024 * 1024
"""A health or burn file larger than this is left out (and said so in facts.json)."""
SECRET_KEY = re.compile(r"pass|secret|token|key|auth|credential|header|cookie|bearer", re.IGNORECASE)
REMOVED = "<removed by gpumon bundle>"


def configure(parser: argparse.ArgumentParser) -> None:
    """Give ``gpumon bundle``'s parser (made by gpumon.cli) its options and command."""
    parser.description = (
        "Collect what a bug report needs into one .tar.gz: a recording of this host's GPUs (plays with "
        "--backend replay:FILE), the config with secrets removed, the health files, the last burn report "
        "and version facts. Attach it to the issue."
    )
    parser.add_argument(
        "-o", "--output", type=Path, help="the archive (default gpumon-bundle-<host>-<UTC time>.tar.gz)"
    )
    parser.add_argument("--config", type=Path, help=f"the gpumon config file (default {DEFAULT_CONFIG} if it exists)")
    parser.add_argument("--state-dir", type=Path, dest="state_dir", help="state directory (default: the config's)")
    parser.add_argument("--polls", type=polls_count, default=5, help="polls to record (default 5)")
    parser.add_argument(
        "--interval-seconds",
        type=poll_interval_seconds,
        default=1.0,
        dest="interval_seconds",
        help="time between polls (default 1)",
    )
    parser.add_argument("--no-redact", action="store_true", dest="no_redact", help="keep serials, UUIDs and pids")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, binding: Any | None = None) -> int:
    """The command: gather, write the archive, say what is in it. ``binding``: the pynvml module to
    record (None: the installed one; tests pass tests/fake_pynvml.py)."""
    logging.basicConfig(level=logging.ERROR)  # what went wrong is said once, in the notes below
    stamp = datetime.now(UTC)
    output = args.output or Path(f"gpumon-bundle-{_safe(socket.gethostname())}-{stamp:%Y%m%dT%H%M%SZ}.tar.gz")
    problems: list[str] = []
    members: dict[str, bytes] = {}
    config_path = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
    config = _config(config_path, problems)
    if config is not None:
        members["config.yaml"] = config.encode()
    state_dir = args.state_dir or _state_dir_of(config_path) or DEFAULT_STATE_DIR
    members.update(_state_files(state_dir, problems))
    request = RecordRequest(max(1, args.polls), max(0.0, args.interval_seconds), "bundle", not args.no_redact)
    recording = _recording(request, binding, problems)
    if recording is not None:
        members[BUNDLE_MEMBER] = recording.encode()
    members["facts.json"] = json.dumps(_facts(stamp, config_path, state_dir, problems), indent=1).encode()
    try:
        _write(output, members, stamp.timestamp())
    except OSError as exc:
        print(f"gpumon bundle: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"gpumon bundle: {output} ({', '.join(sorted(members))})")
    for problem in problems:
        print(f"  note: {problem}")
    if recording is not None:
        print(f"attach it to your issue; play it: gpumon once --backend replay:{output}")
    return EXIT_OK


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:64] or "host"


def _recording(request: RecordRequest, binding: Any | None, problems: list[str]) -> str | None:
    try:
        recording, _ = record(request, binding)
    except Exception as exc:  # NVML missing, a driver fault: the bundle is still worth having
        problems.append(f"no recording: {exc}")
        return None
    return recording.dumps()


def _config(path: Path | None, problems: list[str]) -> str | None:
    """The config file's YAML with its secrets removed, or None (the reason in ``problems``)."""
    if path is None:
        problems.append("no config file (gpumon runs on its defaults)")
        return None
    from gpumon.util.yamlfile import YamlFileError, read_yaml

    try:
        data = read_yaml(path)
    except YamlFileError as exc:  # the text may hold secrets: only the reason goes in
        problems.append(f"config {path} not included: {exc}")
        return None
    import yaml

    text: str = yaml.safe_dump(scrub(data), sort_keys=False, allow_unicode=True)
    return f"# {path}, secrets removed by gpumon bundle\n{text}"


def scrub(value: Any, key: str = "") -> Any:
    """``value`` (parsed YAML) with every secret removed: values under secret-looking keys, URLs cut to
    scheme://host:port."""
    if SECRET_KEY.search(key) and value not in (None, "", [], {}) and not isinstance(value, bool):
        return REMOVED
    if isinstance(value, dict):
        return {k: scrub(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, key) for v in value]
    if isinstance(value, str) and "://" in value:
        parts = urlsplit(value)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        cut = parts.path not in ("", "/") or parts.query or parts.username or parts.password
        return f"{parts.scheme}://{host}{port}" + ("/<path removed>" if cut else "")
    return value


def _state_dir_of(config: Path | None) -> Path | None:
    if config is None:
        return None
    try:
        from gpumon.util.yamlfile import read_yaml

        data = read_yaml(config)
    except Exception:
        return None
    value = data.get("state_dir") if isinstance(data, dict) else None
    return Path(value) if isinstance(value, str) and value else None


def _state_files(state_dir: Path, problems: list[str]) -> dict[str, bytes]:
    """The health files and the last burn report, by their name in the archive."""
    wanted = [(p, f"health/{p.name}") for p in sorted((state_dir / "health").glob("*.json*"))]
    wanted.append((state_dir / "burn" / "last.json", "burn-last.json"))
    out: dict[str, bytes] = {}
    for path, name in wanted:
        try:
            if not path.is_file():
                continue
            if path.stat().st_size > MAX_FILE_BYTES:
                problems.append(f"{path} left out: larger than {MAX_FILE_BYTES // 1024 // 1024} MiB")
                continue
            out[name] = path.read_bytes()
        except OSError as exc:
            problems.append(f"{path} not readable: {exc.strerror or exc}")
    if not out:
        problems.append(f"no health files or burn report under {state_dir}")
    return out


def _facts(stamp: datetime, config: Path | None, state_dir: Path, problems: list[str]) -> dict[str, Any]:
    from importlib import metadata

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    try:
        driver = Path("/proc/driver/nvidia/version").read_text(errors="replace").strip()[:500]
    except OSError:
        driver = None
    return {
        "made_at": f"{stamp:%Y-%m-%dT%H:%M:%SZ}",
        "gpumon": __version__,
        "python": platform.python_version(),
        "nvidia_ml_py": version("nvidia-ml-py"),
        "prometheus_client": version("prometheus-client"),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "nvidia_driver": driver,
        "config": str(config) if config else None,
        "state_dir": str(state_dir),
        "command": sys.argv[1:],
        "problems": problems,
    }


def _write(output: Path, members: dict[str, bytes], mtime: float) -> None:
    tmp = output.with_name(f".{output.name}.{int(time.time() * 1000)}")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(f"gpumon-bundle/{name}")
                info.size, info.mtime, info.mode = len(data), int(mtime), 0o644
                tar.addfile(info, io.BytesIO(data))
        tmp.replace(output)
    finally:
        tmp.unlink(missing_ok=True)

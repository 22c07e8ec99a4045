"""``gpumon alerts``: print the active alerts of a running daemon (from its /api/alerts)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

from gpumon.util.jsonout import add_json_option, emit_json, to_stdout

DEFAULT_URL = "http://127.0.0.1:10480"
_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_STATE_STYLE = {"firing": "bold", "pending": "dim", "suppressed": "magenta"}


MAX_REPLY_BYTES = 64 * 1024 * 1024
"""The largest /api/alerts answer read (thousands of alerts are a few MiB)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Give ``gpumon alerts``'s parser (made by gpumon.cli) its description, options and command."""
    parser.description = "Show pending, firing and suppressed alerts of a running gpumon daemon (GET /api/alerts)."
    parser.add_argument(
        "--url",
        default=None,
        help=f"the daemon's base URL (default: from the config's listen address, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--config", type=Path, help="gpumon config whose listen address gives the URL (default /etc/gpumon/gpumon.yaml)"
    )
    add_json_option(parser, "the daemon's answer")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the daemon (default 5)")
    parser.set_defaults(func=run)


def _default_url(args: argparse.Namespace) -> str:
    """The daemon URL from ``--config``'s listen address (0.0.0.0 becomes 127.0.0.1)."""
    try:
        from gpumon.config import file as gpumon_config

        path = getattr(args, "config", None)
        cfg = gpumon_config.load(Path(path) if path else None)
        host, port = cfg.listen_address()
    except Exception:
        return DEFAULT_URL
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def run(args: argparse.Namespace) -> int:
    """Fetch and print the alerts; 0 when fetched, 1 when the daemon cannot be reached."""
    base = (args.url or _default_url(args)).rstrip("/")
    url = base + "/api/alerts"
    # here, not at the top: every command builds this parser, the daemon too
    import requests
    from rich.console import Console

    from gpumon.util.bounded_reply import get_json

    console = Console()
    try:  # read only so far: whatever answers on that port may send gigabytes
        status, data = get_json(url, getattr(args, "timeout", 5.0), MAX_REPLY_BYTES)
    except requests.RequestException as exc:
        from gpumon.commands.support import terminal_columns, wrapped
        from gpumon.util.net_words import request_failure

        reason = request_failure(exc, getattr(args, "timeout", 5.0))
        line = f"gpumon alerts: no answer from a gpumon daemon at {url}: {reason}"
        print(wrapped("", line, 2, terminal_columns(sys.stderr)), file=sys.stderr)
        return 1
    except ValueError:  # not JSON, or larger than any answer of a gpumon daemon
        print(f"gpumon alerts: {url} did not answer JSON (is it a gpumon daemon?)", file=sys.stderr)
        return 1
    if status != 200:
        print(f"gpumon alerts: cannot reach the gpumon daemon at {url} (it answered HTTP {status})", file=sys.stderr)
        return 1
    if args.json is not None:
        try:
            emit_json(data, args.json)
        except OSError as exc:
            print(f"gpumon alerts: cannot write --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if to_stdout(args.json):
            return 0
    print_table(console, data)
    return 0


def _age(seconds: float | None, now: float) -> str:
    if seconds is None:
        return ""
    age = max(0, int(now - seconds))
    if age < 120:
        return f"{age}s"
    if age < 7200:
        return f"{age // 60}m"
    return f"{age // 3600}h{age % 3600 // 60:02d}m"


def print_table(console: Console, data: dict[str, Any], now: float | None = None) -> None:
    """The alerts as a rich table, then one line per receiver with a queue, an error or a sender not up.

    The table fits 80 columns: each alert's summary is under its name, in the ALERT column. Every
    string from the daemon's answer (names, labels, a receiver's error, which may quote a reply's
    body) is shown as text: never read as markup, escape sequences and hyperlinks shown escaped."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from gpumon.util.outside_text import shown

    now = time.time() if now is None else now
    alerts = data.get("alerts") or []
    host = shown(data.get("host", ""), "")
    if not alerts:
        console.print(Text("No active alerts on ") + host + Text("."))
    else:
        table = Table(title=Text("Active alerts on ") + host, title_justify="left", box=box.SIMPLE_HEAD,
                      show_edge=False, pad_edge=False)  # fmt: skip
        for column in ("STATE", "SEVERITY", "ALERT / SUMMARY", "GPU", "SINCE"):
            table.add_column(column, no_wrap=column != "ALERT / SUMMARY", overflow="fold", ratio=None)
        for a in alerts:
            table.add_row(*_alert_cells(a, now))
        console.print(table)
    for r in data.get("receivers") or []:
        sender = r.get("sender", "up")
        if r.get("queue_length") or r.get("last_error") or sender != "up":
            line = Text("receiver ") + shown(r.get("name")) + Text(f": {r.get('queue_length', 0)} queued")
            if sender != "up":
                line += Text(", ") + Text("sender ", style="bold red") + shown(sender)
                if r.get("sender_problem"):
                    line += Text(" (") + shown(r["sender_problem"]) + Text(")")
            if r.get("last_error"):
                line += Text(", last error: ") + shown(r["last_error"])
            console.print(line)


def _alert_cells(alert: dict[str, Any], now: float) -> tuple[Text, ...]:
    """One alert's cells: state, severity, name with the summary under it, where, since."""
    from rich.text import Text

    from gpumon.util.outside_text import shown

    labels = alert.get("labels") or {}
    extra = [f"{k} {labels[k]}" for k in ("link", "xid") if k in labels]
    where = " ".join([str(alert.get("gpu", "")), *extra]).strip() or "host"
    summary = shown((alert.get("annotations") or {}).get("summary", ""), "")
    if alert.get("held_back"):
        summary += Text(" (") + shown(alert["held_back"]) + Text(")")
    since = alert.get("starts_at") if alert.get("starts_at") is not None else alert.get("active_since")
    state, severity = shown(alert.get("state", ""), ""), shown(alert.get("severity", ""), "")
    state.stylize(_STATE_STYLE.get(state.plain, ""))
    severity.stylize(_SEVERITY_STYLE.get(severity.plain, ""))
    name = shown(alert.get("alertname", ""), "")
    if summary.plain:
        name += Text("\n") + summary
    return state, severity, name, shown(where, ""), Text(_age(since, now))

"""Writes gpumon's Grafana dashboards (dashboards/*.json) from the compact description below.

Run ``make generate`` (or ``python dashboards/generate.py``) after changing it; tests/test_dashboards.py
fails when the JSON files differ from what this script writes. A panel keeps the id it has in the
checked-in file (``panel_ids``) and a new one takes the next free id, so adding a panel adds its
lines and moves only the panels below it down. A declared per-GPU family no panel queries gets a
plain one at the end of the GPU detail dashboard (``unplaced_families``). The JSON is what users import: Grafana
(Dashboards -> New -> Import) or file provisioning. Every panel uses the ``datasource``
variable, so no ``__inputs`` mapping is needed on import.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$instance", gpu=~"$gpu"'
"""The per-GPU selector every per-GPU query carries."""
HOST = 'instance=~"$instance"'
LEGEND = "{{instance}} GPU {{gpu}}"

Panel = dict[str, Any]


def target(expr: str, legend: str = LEGEND, *, instant: bool = False, table: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend, "range": not instant}
    if instant:
        t["instant"] = True
    if table:
        t["format"] = "table"
    return t


def _with_refs(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**t, "refId": chr(ord("A") + i)} for i, t in enumerate(targets)]


def _thresholds(steps: list[tuple[float | None, str]]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def timeseries(
    title: str,
    targets: list[dict[str, Any]],
    unit: str,
    *,
    description: str = "",
    w: int = 12,
    h: int = 8,
    min_value: float | None = None,
    max_value: float | None = None,
    dashed: str | None = None,
    thresholds: list[tuple[float | None, str]] | None = None,
    stack: bool = False,
    draw: str = "line",
) -> Panel:
    """A time series panel. ``dashed``: regex of series names drawn as dashed red limit lines."""
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {
            "drawStyle": draw,
            "lineWidth": 1,
            "fillOpacity": 10 if stack else 0,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "dashed" if thresholds else "off"},
        },
        "thresholds": _thresholds(thresholds or [(None, "green")]),
    }
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    overrides = []
    if dashed:
        overrides.append(
            {
                "matcher": {"id": "byRegexp", "options": dashed},
                "properties": [
                    {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                    {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                    {"id": "custom.fillOpacity", "value": 0},
                ],
            }
        )
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": _with_refs(targets),
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "_size": (w, h),
    }


def stat(
    title: str,
    expr: str,
    unit: str = "none",
    *,
    description: str = "",
    steps: list[tuple[float | None, str]] | None = None,
    w: int = 4,
    h: int = 4,
    legend: str = "",
) -> Panel:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": _with_refs([target(expr, legend, instant=True)]),
        "fieldConfig": {
            "defaults": {"unit": unit, "thresholds": _thresholds(steps or [(None, "green"), (1, "red")])},
            "overrides": [],
        },
        "options": {
            "colorMode": "background",
            "graphMode": "none",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "auto",
        },
        "_size": (w, h),
    }


def table(
    title: str,
    targets: list[dict[str, Any]],
    *,
    description: str = "",
    w: int = 24,
    h: int = 8,
    hide: tuple[str, ...] = ("Time", "__name__", "job"),
    rename: dict[str, str] | None = None,
    units: dict[str, str] | None = None,
) -> Panel:
    overrides = [
        {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
        for name, unit in (units or {}).items()
    ]
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": _with_refs(targets),
        "fieldConfig": {"defaults": {}, "overrides": overrides},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {"excludeByName": dict.fromkeys(hide, True), "renameByName": rename or {}},
            },
        ],
        "_size": (w, h),
    }


def row(title: str) -> Panel:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def variables(extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    def query_var(name: str, label: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
            "query": {"query": query, "refId": f"{name}-var"},
            "definition": query,
            "refresh": 2,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 3,
        }

    return {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
            },
            query_var("instance", "Host", "label_values(gpumon_gpu_info, instance)"),
            query_var("gpu", "GPU", 'label_values(gpumon_gpu_info{instance=~"$instance"}, gpu)'),
            *(extra or []),
        ]
    }


PanelKey = tuple[str, str]
"""A panel's type and title: what keeps its id from one generation to the next."""


def checked_in_ids(uid: str) -> dict[PanelKey, int]:
    """The panel ids of the dashboard's checked-in file (``<uid>.json``), by type and title; none without it."""
    path = HERE / f"{uid}.json"
    if not path.exists():
        return {}
    return {(p["type"], p["title"]): p["id"] for p in json.loads(path.read_text(encoding="utf-8"))["panels"]}


def panel_ids(panels: list[Panel], known: dict[PanelKey, int]) -> list[int]:
    """Each panel's id: the one it has in ``known``, else the next free one, so adding a panel renumbers
    no other (Grafana links to a panel by id, and the diff stays the new panel's lines)."""
    keys = [(p["type"], p["title"]) for p in panels]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"two panels of one type share a title (the key of their ids): {twice}")
    next_free = max((known[k] for k in keys if k in known), default=0) + 1
    ids = []
    for key in keys:
        if key in known:
            ids.append(known[key])
        else:
            ids.append(next_free)
            next_free += 1
    return ids


def layout(panels: list[Panel], known: dict[PanelKey, int]) -> list[Panel]:
    """Give every panel its id (``panel_ids``) and a gridPos, filling 24-column lines left to right."""
    x = y = line_height = 0
    out = []
    for panel_id, panel in zip(panel_ids(panels, known), panels, strict=True):
        fields = dict(panel)
        w, h = fields.pop("_size")
        if fields["type"] == "row" or x + w > 24:
            y += line_height
            x, line_height = 0, 0
        out.append({"id": panel_id, "gridPos": {"x": x, "y": y, "w": w, "h": h}, **fields})
        x += w
        line_height = max(line_height, h)
        if fields["type"] == "row":
            y += 1
            x, line_height = 0, 0
    return out


def dashboard(uid: str, title: str, description: str, panels: list[Panel], **kw: Any) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpumon", "gpu", "nvidia"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": kw.pop("time_from", "now-6h"), "to": "now"},
        "templating": variables(kw.pop("extra_variables", None)),
        "annotations": {"list": []},
        "links": [{"title": "gpumon dashboards", "type": "dashboards", "tags": ["gpumon"], "asDropdown": True}],
        "panels": layout(panels, checked_in_ids(uid)),
    }


# --- fleet ------------------------------------------------------------------------------------

HW_REASONS = "hw_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown|sw_thermal_slowdown"


def fleet() -> dict[str, Any]:
    def count(expr: str) -> str:
        return f"count({expr}) or vector(0)"

    panels = [
        row("Health at a glance"),
        stat("GPUs monitored", f"count(gpumon_gpu_info{{{SEL}}})", steps=[(None, "blue")],
             description="GPUs gpumon reports on the selected hosts."),
        stat("GPUs lost", count(f"gpumon_gpu_up{{{SEL}}} == 0"),
             description="Fallen off the bus or needing a reset (gpumon_gpu_up == 0)."),
        stat("Hosts with NVML down", count(f"gpumon_nvml_up{{{HOST}}} == 0"),
             description="gpumon cannot talk to the driver: none of that host's GPUs are watched."),
        stat("Hosts not scraped", count(f'up{{job=~"gpumon.*", {HOST}}} == 0'),
             description="Prometheus cannot reach gpumon (job names starting with gpumon)."),
        stat("Stale exporters", count(f"gpumon_snapshot_age_seconds{{{HOST}}} > 30"),
             description="The served snapshot is over 30 s old: a poll hangs (often a GPU fallen off the bus)."),
        stat("Firing gpumon alerts", f'sum(gpumon_alerts{{state="firing", {HOST}}}) or vector(0)',
             description="Alerts gpumon's own alert engine holds firing."),
        stat("GPUs with XIDs (24 h)",
             count(f"count by (instance, gpu) (time() - gpumon_xid_last_timestamp_seconds{{{SEL}}} < 86400)"),
             description="GPUs that reported any XID error in the last 24 hours."),
        stat("GPUs with uncorrectable ECC",
             count(f'gpumon_ecc_errors_total{{type="uncorrected", scope="volatile", {SEL}}} > 0'),
             description="Volatile (since driver load) uncorrectable ECC errors."),
        stat("Row remap pending / failed",
             count(f"gpumon_row_remap_pending{{{SEL}}} == 1 or gpumon_row_remap_failure{{{SEL}}} == 1"),
             description="A pending remap needs a GPU reset; a failed one means RMA."),
        stat("GPUs throttled by HW / thermal",
             count(f'count by (instance, gpu) (gpumon_clock_event_active{{reason=~"{HW_REASONS}", {SEL}}} == 1)'),
             description="Clock event reasons hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, "
             "sw_thermal_slowdown active now."),
        stat("GPUs with an NVLink down",
             count(f"count by (instance, gpu) (gpumon_nvlink_links_up{{{SEL}}} "
                   f"< max_over_time(gpumon_nvlink_links_up{{{SEL}}}[1h]))"),
             description="Fewer links up than in the last hour: a link that was up is down now."),
        stat("GPUs whose driver asks for recovery", count(f'gpumon_recovery_action_info{{action!="none", {SEL}}}'),
             description="nvidia-smi gpu_recovery_action is not None: the GPU needs a reset, a drain or a reboot."),
        stat("GPUs not registered in the NVSwitch fabric", count(f"gpumon_fabric_status_ok{{{SEL}}} == 0"),
             description="HGX/NVSwitch systems only: CUDA cannot start on these GPUs until nvidia-fabricmanager "
             "registers them."),
        stat("GPUs near slowdown temperature",
             count(f'gpumon_temperature_threshold_celsius{{kind="slowdown", {SEL}}} '
                   f'- ignoring (kind, sensor) gpumon_temperature_celsius{{sensor="gpu", {SEL}}} <= 5'),
             description="Within 5 °C of the GPU's own slowdown temperature."),
        stat("Nodes CRITICAL (gpumon health)", count(f"gpumon_node_health_status{{{HOST}}} == 2"),
             description="Nodes whose gpumon health verdict is CRITICAL: drain them (Slurm: gpumon does, if configured)."),
        stat("GPUs behind their peers (stragglers)",
             count(f'gpumon_straggler_deviation_ratio{{signal=~"sm_clock|compute_share", {SEL}}} < -0.10'),
             description="Busy GPUs whose SM clock or busiest process's SM time is over 10 % below the median of "
             "their same-model peers over the straggler window (gpumon_straggler_deviation_ratio; gpumon health "
             "names them once it lasts). See docs/early-signals.md."),
        stat("Hosts on simulated GPUs", f"count(gpumon_simulated{{{HOST}}} == 1) or vector(0)",
             description="Daemons running on the fake backend (a demo or a test): their GPUs are not real "
             "hardware (gpumon_simulated; docs/scenarios.md)."),
        stat("Health findings", f"sum(gpumon_health_findings{{{HOST}}}) or vector(0)",
             description="Findings behind the verdicts: XIDs waiting for a repair, inventory drift, lost GPUs."),
        table("Jobs let through unjudged (gpumon health)", [
            target(f"gpumon_health_unjudged_total{{{HOST}}}", instant=True, table=True),
            target(f"max by (instance, hook) (gpumon_health_unjudged_last_timestamp_seconds{{{HOST}}})"
                   f" or max by (instance, hook) (0 * gpumon_health_unjudged_total{{{HOST}}})", instant=True, table=True),
        ], description="Slurm prologs and epilogs whose check could not judge (UNKNOWN) and let the job through, "
            "by hook, and when the last one did.", h=5, w=12,
            rename={"Value #A": "jobs let through", "Value #B": "last (unix s, 0: never)"}),
        table("Node verdicts (gpumon health)", [target(f"gpumon_node_health_status{{{HOST}}}", instant=True, table=True)],
              description="0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN, with the recommended action and the reason.",
              h=5, rename={"Value": "status"}),
        table("GPU verdicts (gpumon health)", [target(f"gpumon_health_status{{{SEL}}}", instant=True, table=True)],
              description="Per GPU: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN, with the action and the reason.",
              h=6, hide=("Time", "__name__", "job", "uuid"), rename={"Value": "status"}),
        table(
            "Every GPU",
            [
                target(f"gpumon_gpu_info{{{SEL}}}", instant=True, table=True),
                target(f"max by (instance, gpu) (gpumon_gpu_up{{{SEL}}})", instant=True, table=True),
                target(f'max by (instance, gpu) (gpumon_temperature_celsius{{sensor="gpu", {SEL}}})',
                       instant=True, table=True),
                target(f"max by (instance, gpu) (gpumon_power_watts{{{SEL}}})", instant=True, table=True),
                target(f"max by (instance, gpu) (gpumon_gpu_utilization_ratio{{{SEL}}})", instant=True, table=True),
                target(f"max by (instance, gpu) (gpumon_memory_used_bytes{{{SEL}}} / gpumon_memory_total_bytes{{{SEL}}})",
                       instant=True, table=True),
                target(f"sum by (instance, gpu) (gpumon_xid_errors_total{{{SEL}}})", instant=True, table=True),
                target(f'max by (instance, gpu) (gpumon_ecc_errors_total{{type="uncorrected", scope="volatile", {SEL}}})',
                       instant=True, table=True),
                target(f"max by (instance, gpu) (gpumon_row_remap_pending{{{SEL}}} + gpumon_row_remap_failure{{{SEL}}})",
                       instant=True, table=True),
                target(f'sum by (instance, gpu) (gpumon_clock_event_active{{reason=~"{HW_REASONS}", {SEL}}})'
                       f" or max by (instance, gpu) (0 * gpumon_gpu_up{{{SEL}}})",
                       instant=True, table=True),
                target(f"max by (instance, gpu) (gpumon_nvlink_links{{{SEL}}} - gpumon_nvlink_links_up{{{SEL}}})",
                       instant=True, table=True),
            ],
            description="One line per GPU; blank cells mean the GPU does not report that field.",
            h=10,
            hide=("Time", "__name__", "job", "Value #A", "uuid", "serial", "vbios_version", "cuda_driver_version",
                  "compute_capability"),
            rename={"Value #B": "up", "Value #C": "temp °C", "Value #D": "power W", "Value #E": "util",
                    "Value #F": "memory used", "Value #G": "XIDs", "Value #H": "uncorr. ECC",
                    "Value #I": "row remap pending+failed", "Value #J": "HW/thermal throttle reasons",
                    "Value #K": "NVLinks down"},
            units={"util": "percentunit", "memory used": "percentunit", "temp °C": "celsius", "power W": "watt"},
        ),
        row("Trends"),
        timeseries("Temperature", [
            target(f'gpumon_temperature_celsius{{sensor="gpu", {SEL}}}'),
            target(f'gpumon_temperature_threshold_celsius{{kind="slowdown", {SEL}}}', "slowdown {{instance}} GPU {{gpu}}"),
        ], "celsius", dashed="^slowdown .*", description="GPU core temperature; dashed: each GPU's slowdown temperature."),
        timeseries("Power", [
            target(f"gpumon_power_watts{{{SEL}}}"),
            target(f"gpumon_power_limit_watts{{{SEL}}}", "limit {{instance}} GPU {{gpu}}"),
        ], "watt", dashed="^limit .*", description="Power draw; dashed: enforced power limit."),
        timeseries("Utilization", [target(f"gpumon_gpu_utilization_ratio{{{SEL}}}")], "percentunit",
                   min_value=0, max_value=1),
        timeseries("Memory used", [
            target(f"gpumon_memory_used_bytes{{{SEL}}} / gpumon_memory_total_bytes{{{SEL}}}"),
        ], "percentunit", min_value=0, max_value=1, thresholds=[(None, "green"), (0.9, "orange")]),
        timeseries("XID errors", [
            target(f"sum by (instance, gpu, xid) (increase(gpumon_xid_errors_total{{{SEL}}}[$__rate_interval]))",
                   "{{instance}} GPU {{gpu}} XID {{xid}}"),
        ], "short", draw="bars", description="XID events per interval, by code."),
        timeseries("Error counters rising (per trend window)", [
            target(f'gpumon_error_trend_increase{{{SEL}}} > 0',
                   "{{instance}} GPU {{gpu}} {{counter}}{{xid}} in {{window_seconds}} s"),
        ], "short", min_value=0,
            description="How much each error counter rose within its trend window (corrected ECC 1 h, remapped "
            "rows and retired pages 24 h, PCIe and NVLink replays 1 min, NVLink recoveries and XIDs 1 h); "
            "gpumon health warns past each limit (docs/early-signals.md)."),
        timeseries("Throttle time (HW / thermal / power)", [
            target(f"rate(gpumon_throttle_seconds_total{{{SEL}}}[$__rate_interval])",
                   "{{instance}} GPU {{gpu}} {{reason}}"),
        ], "percentunit", min_value=0,
            description="Share of time the clocks were held down, by reason (NVML violation counters)."),
    ]  # fmt: skip
    return dashboard(
        "gpumon-fleet",
        "gpumon / Fleet",
        "Health of every GPU gpumon watches: lost GPUs, XIDs, ECC, row remap, throttling, NVLink, "
        "temperature, power, utilization and memory.",
        panels,
    )


# --- GPU detail ---------------------------------------------------------------------------------------


def unplaced_families(panels: list[Panel]) -> list[Panel]:
    """A row with one plain panel per declared per-GPU family no panel above queries yet, so a new field
    shows on the dashboard without an edit here (give it a panel of its own when it deserves one)."""
    from gpumon.exposition.metrics import gpu_rows

    exprs = json.dumps(panels)
    missing = [r for r in gpu_rows() if not re.search(rf"\b{r.name}\b", exprs)]
    if not missing:
        return []
    out = [row("More per-GPU metrics")]
    for r in missing:
        labels = "".join(f" {{{{{label}}}}}" for label in r.labels)
        expr = f"rate({r.name}{{{SEL}}}[$__rate_interval])" if r.kind == "counter" else f"{r.name}{{{SEL}}}"
        out.append(timeseries(r.name, [target(expr, LEGEND + labels)], _unit_of(r.name), description=r.help))
    return out


def _unit_of(name: str) -> str:
    """Grafana's unit for a family by its base-unit suffix."""
    for suffix, unit in (
        ("_ratio", "percentunit"),
        ("_bytes", "bytes"),
        ("_bytes_total", "Bps"),
        ("_celsius", "celsius"),
        ("_watts", "watt"),
        ("_hertz", "hertz"),
        ("_seconds", "s"),
    ):
        if name.endswith(suffix):
            return unit
    return "short"


def gpu_detail() -> dict[str, Any]:
    def ts(title: str, expr: str, unit: str, legend: str = LEGEND, **kw: Any) -> Panel:
        return timeseries(title, [target(expr, legend)], unit, **kw)

    lg = lambda extra: LEGEND + " " + extra  # noqa: E731
    panels = [
        row("Identity and exporter"),
        table("GPUs", [target(f"gpumon_gpu_info{{{SEL}}}", instant=True, table=True)],
              hide=("Time", "__name__", "job", "Value"), h=6),
        stat("NVML up", f"min(gpumon_nvml_up{{{HOST}}})", steps=[(None, "red"), (1, "green")], w=3),
        stat("GPUs on host(s)", f"sum(gpumon_gpus{{{HOST}}})", steps=[(None, "blue")], w=3),
        stat("Snapshot age", f"max(gpumon_snapshot_age_seconds{{{HOST}}})", "s",
             steps=[(None, "green"), (10, "orange"), (30, "red")], w=3),
        stat("Snapshot taken", f"max(gpumon_snapshot_timestamp_seconds{{{HOST}}}) * 1000", "dateTimeFromNow",
             steps=[(None, "blue")], w=3),
        table("gpumon build", [target(f"gpumon_build_info{{{HOST}}}", instant=True, table=True)],
              hide=("Time", "__name__", "job", "Value"), w=12, h=4),
        ts("GPU up", f"gpumon_gpu_up{{{SEL}}}", "bool", min_value=0, max_value=1, w=12),
        row("Utilization"),
        ts("GPU utilization", f"gpumon_gpu_utilization_ratio{{{SEL}}}", "percentunit", min_value=0, max_value=1),
        ts("Memory bandwidth utilization", f"gpumon_memory_bandwidth_utilization_ratio{{{SEL}}}", "percentunit",
           min_value=0, max_value=1),
        timeseries("Video encoder / decoder", [
            target(f"gpumon_encoder_utilization_ratio{{{SEL}}}", lg("encoder")),
            target(f"gpumon_decoder_utilization_ratio{{{SEL}}}", lg("decoder")),
        ], "percentunit", min_value=0, max_value=1),
        timeseries("Profiling: graphics engine, SM, tensor, DRAM (GPM, Hopper and newer)", [
            target(f"gpumon_graphics_active_ratio{{{SEL}}}", lg("graphics engine")),
            target(f"gpumon_sm_active_ratio{{{SEL}}}", lg("SM active")),
            target(f"gpumon_sm_occupancy_ratio{{{SEL}}}", lg("SM occupancy")),
            target(f"gpumon_tensor_active_ratio{{{SEL}}}", lg("tensor")),
            target(f"gpumon_dram_active_ratio{{{SEL}}}", lg("DRAM")),
        ], "percentunit", min_value=0, max_value=1),
        timeseries("Profiling: FP64 / FP32 / FP16 pipes (GPM)", [
            target(f"gpumon_fp64_active_ratio{{{SEL}}}", lg("FP64")),
            target(f"gpumon_fp32_active_ratio{{{SEL}}}", lg("FP32")),
            target(f"gpumon_fp16_active_ratio{{{SEL}}}", lg("FP16")),
        ], "percentunit", min_value=0, max_value=1),
        ts("NVLink / PCIe throughput (GPM)", f"gpumon_gpm_throughput_bytes_per_second{{{SEL}}}", "Bps",
           lg("{{link}} {{direction}}")),
        row("Memory"),
        timeseries("Framebuffer memory", [
            target(f"gpumon_memory_used_bytes{{{SEL}}}", lg("used")),
            target(f"gpumon_memory_reserved_bytes{{{SEL}}}", lg("reserved")),
            target(f"gpumon_memory_free_bytes{{{SEL}}}", lg("free")),
            target(f"gpumon_memory_total_bytes{{{SEL}}}", lg("total")),
        ], "bytes", dashed=".* total$", min_value=0),
        ts("Memory used", f"gpumon_memory_used_bytes{{{SEL}}} / gpumon_memory_total_bytes{{{SEL}}}", "percentunit",
           min_value=0, max_value=1, thresholds=[(None, "green"), (0.9, "orange")]),
        row("Temperature and cooling"),
        timeseries("Temperature and thresholds", [
            target(f"gpumon_temperature_celsius{{{SEL}}}", lg("{{sensor}}")),
            target(f"gpumon_temperature_threshold_celsius{{{SEL}}}", lg("limit {{kind}}")),
        ], "celsius", dashed=".* limit .*",
            description="Dashed: the GPU's own slowdown, shutdown and max operating temperatures."),
        ts("Fan speed", f"gpumon_fan_speed_ratio{{{SEL}}}", "percentunit", lg("fan {{fan}}"), min_value=0,
           max_value=1, description="Not reported by passively cooled (SXM) GPUs."),
        row("Power and energy"),
        timeseries("Power and limit", [
            target(f"gpumon_power_watts{{{SEL}}}", lg("draw")),
            target(f"gpumon_power_limit_watts{{{SEL}}}", lg("limit")),
        ], "watt", dashed=".* limit$", min_value=0),
        ts("Average power from the energy counter", f"rate(gpumon_energy_joules_total{{{SEL}}}[$__rate_interval])",
           "watt", min_value=0),
        ts("Energy in the selected time range", f"increase(gpumon_energy_joules_total{{{SEL}}}[$__range]) / 3.6e6",
           "kwatth", draw="bars", w=12),
        ts("Performance state", f"gpumon_performance_state{{{SEL}}}", "none", min_value=0, max_value=15, w=12,
           description="P0 is the highest performance state, P15 the lowest."),
        row("Clocks and throttling"),
        timeseries("Clocks and maximum", [
            target(f"gpumon_clock_hertz{{{SEL}}}", lg("{{domain}}")),
            target(f"gpumon_clock_max_hertz{{{SEL}}}", lg("max {{domain}}")),
        ], "hertz", dashed=".* max .*"),
        ts("Clock event reasons active", f"gpumon_clock_event_active{{{SEL}}} == 1", "bool", lg("{{reason}}"),
           min_value=0, max_value=1, draw="points",
           description="Only reasons that are active are drawn; gpu_idle and sw_power_cap are normal."),
        ts("Throttle time by reason", f"rate(gpumon_throttle_seconds_total{{{SEL}}}[$__rate_interval])",
           "percentunit", lg("{{reason}}"), min_value=0),
        row("PCIe"),
        timeseries("PCIe link", [
            target(f"gpumon_pcie_link_generation{{{SEL}}}", lg("gen {{state}}")),
            target(f"gpumon_pcie_link_width{{{SEL}}}", lg("width {{state}}")),
        ], "none", dashed=".* max$", description="Idle GPUs lower the link generation on purpose."),
        timeseries("PCIe throughput", [
            target(f"rate(gpumon_pcie_bytes_total{{{SEL}}}[$__rate_interval])", lg("{{direction}} (counter rate)")),
            target(f"gpumon_pcie_throughput_bytes_per_second{{{SEL}}}", lg("{{direction}} (gpumon, slow tier)")),
        ], "Bps", description="gpumon_pcie_throughput_bytes_per_second only with exporter.detail profiling."),
        ts("PCIe replays", f"increase(gpumon_pcie_replays_total{{{SEL}}}[$__rate_interval])", "short", w=12),
        row("ECC and memory health"),
        ts("ECC errors", f"gpumon_ecc_errors_total{{{SEL}}}", "short", lg("{{type}} {{scope}}")),
        ts("Remapped rows", f"gpumon_remapped_rows{{{SEL}}}", "short", lg("{{kind}}")),
        timeseries("Row remap pending / failure, page retirement pending", [
            target(f"gpumon_row_remap_pending{{{SEL}}}", lg("remap pending")),
            target(f"gpumon_row_remap_failure{{{SEL}}}", lg("remap failure")),
            target(f"gpumon_retired_pages_pending{{{SEL}}}", lg("retirement pending")),
        ], "bool", min_value=0, max_value=1),
        ts("Retired pages (before Ampere)", f"gpumon_retired_pages{{{SEL}}}", "short", lg("{{cause}}")),
        ts("Memory banks by spare rows left", f"gpumon_row_remap_banks{{{SEL}}}", "short", lg("{{availability}}"),
           description="nvidia-smi remapped_rows.histogram: banks at max, high, partial, low and no spare-row "
           "availability. Banks at none cannot remap another row."),
        ts("Recovery action the driver asks for", f'gpumon_recovery_action_info{{action!="none", {SEL}}}', "bool",
           lg("{{action}}"), draw="points", description="nvidia-smi gpu_recovery_action: empty while it is none."),
        row("Modes"),
        table("Modes", [
            target(f"gpumon_ecc_mode_enabled{{{SEL}}}", instant=True, table=True),
            target(f"gpumon_persistence_mode_enabled{{{SEL}}}", instant=True, table=True),
            target(f"gpumon_mig_mode_enabled{{{SEL}}}", instant=True, table=True),
            target(f"gpumon_compute_mode_info{{{SEL}}}", instant=True, table=True),
            target(f"gpumon_fabric_state_info{{{SEL}}}", instant=True, table=True),
            target(f"gpumon_fabric_status_ok{{{SEL}}}", instant=True, table=True),
        ], hide=("Time", "__name__", "job", "Value #D", "Value #E"),
            rename={"Value #A": "ECC", "Value #B": "persistence", "Value #C": "MIG", "mode": "compute mode",
                    "state": "NVSwitch fabric", "Value #F": "fabric ok"}, h=6,
            description="NVSwitch fabric columns stay empty on GPUs outside a fabric (PCIe cards, NVLink bridges)."),
        row("NVLink and topology"),
        ts("NVLink links down", f"gpumon_nvlink_link_up{{{SEL}}} == 0", "bool", lg("link {{link}}"),
           draw="points", description="Links that report down now (links never trained also show here)."),
        timeseries("NVLink links up", [
            target(f"gpumon_nvlink_links_up{{{SEL}}}", lg("up")),
            target(f"gpumon_nvlink_links{{{SEL}}}", lg("links")),
        ], "short"),
        ts("NVLink errors", f"sum by (instance, gpu, type) (increase(gpumon_nvlink_errors_total{{{SEL}}}[$__rate_interval]))",
           "short", lg("{{type}}")),
        ts("NVLink errors by link", f"gpumon_nvlink_link_errors_total{{{SEL}}}", "short", lg("link {{link}} {{type}}"),
           description="Links with errors (every link with exporter.detail nvlink_per_link)."),
        table("Peer-to-peer and topology", [
            target(f"gpumon_p2p_status{{{SEL}}}", instant=True, table=True),
            target(f"gpumon_topology_info{{{SEL}}}", instant=True, table=True),
        ], hide=("Time", "__name__", "job", "uuid", "Value #B"), rename={"Value #A": "p2p ok"}, w=12,
            description="P2P capabilities that fail; every one with exporter.detail p2p, the topology with "
            "exporter.detail topology."),
        row("XID errors"),
        ts("XID events", f"sum by (instance, gpu, xid) (increase(gpumon_xid_errors_total{{{SEL}}}[$__rate_interval]))",
           "short", lg("XID {{xid}}"), draw="bars"),
        table("Last XID by code", [
            target(f"gpumon_xid_last_timestamp_seconds{{{SEL}}} * 1000", instant=True, table=True),
            target(f"gpumon_xid_errors_total{{{SEL}}}", instant=True, table=True),
        ], hide=("Time", "__name__", "job", "uuid"), rename={"Value #A": "last seen", "Value #B": "count"},
            units={"last seen": "dateTimeAsIso"}, w=12),
        row("Processes"),
        ts("Compute processes", f"gpumon_processes{{{SEL}}}", "short", w=8),
        ts("Memory held by processes", f"gpumon_process_memory_bytes{{{SEL}}}", "bytes", w=8),
        ts("Per process memory (exporter.processes: true)", f"gpumon_process_used_memory_bytes{{{SEL}}}", "bytes",
           lg("{{name}} pid {{pid}} {{user}}"), w=8),
        ts("Per process SM utilization", f"gpumon_process_sm_utilization_ratio{{{SEL}}}", "percentunit",
           lg("{{name}} pid {{pid}}"), min_value=0, max_value=1, w=24),
        row("Host"),
        ts("Host CPU", f"gpumon_host_cpu_utilization_ratio{{{HOST}}}", "percentunit", "{{instance}}",
           min_value=0, max_value=1),
        timeseries("Host memory", [
            target(f"gpumon_host_memory_used_bytes{{{HOST}}}", "{{instance}} used"),
            target(f"gpumon_host_memory_total_bytes{{{HOST}}}", "{{instance}} total"),
        ], "bytes", dashed=".* total$", min_value=0),
        row("gpumon itself"),
        ts("Poll duration by tier", f"gpumon_poll_duration_seconds{{{HOST}}}", "s", "{{instance}} {{tier}}", w=8),
        timeseries("Poll errors and skipped polls", [
            target(f"increase(gpumon_poll_errors_total{{{HOST}}}[$__rate_interval])", "{{instance}} errors {{tier}}"),
            target(f"increase(gpumon_poll_skipped_total{{{HOST}}}[$__rate_interval])", "{{instance}} skipped"),
        ], "short", w=8),
        ts("Age of each tier", f"time() - gpumon_last_poll_timestamp_seconds{{{HOST}}}", "s", "{{instance}} {{tier}}",
           w=8),
        timeseries("Collectors", [
            target(f"gpumon_collector_success{{{HOST}}}", "{{instance}} {{collector}} success"),
            target(f"gpumon_collector_duration_seconds{{{HOST}}}", "{{instance}} {{collector}} seconds"),
        ], "short", w=12),
        timeseries("gpumon alerts", [
            target(f"sum by (instance, alertname, state) (gpumon_alerts{{{HOST}}})", "{{instance}} {{alertname}} {{state}}"),
            target(f"sum by (instance) (gpumon_alerts_held_back{{{HOST}}})", "{{instance}} held back (burn)"),
        ], "short", w=12),
        timeseries("Alert delivery", [
            target(f"increase(gpumon_alert_notifications_total{{{HOST}}}[$__rate_interval])",
                   "{{instance}} {{receiver}} {{outcome}}"),
            target(f"gpumon_alert_queue_length{{{HOST}}}", "{{instance}} queued {{receiver}}"),
            target(f"increase(gpumon_alert_evaluation_errors_total{{{HOST}}}[$__rate_interval])",
                   "{{instance}} evaluation errors"),
            target(f"increase(gpumon_alert_spool_write_errors_total{{{HOST}}}[$__rate_interval])",
                   "{{instance}} spool write errors"),
            target(f"gpumon_alert_spool_damaged_total{{{HOST}}}", "{{instance}} spool parts damaged at start"),
        ], "short", w=12),
        timeseries("Alert senders (1 = up, 0 = stuck or stopped)", [
            target(f"gpumon_alert_sender_up{{{HOST}}}", "{{instance}} {{receiver}} up"),
            target(f"increase(gpumon_alert_sender_errors_total{{{HOST}}}[$__rate_interval])",
                   "{{instance}} {{receiver}} sender errors"),
            target(f"time() - gpumon_alert_sender_last_attempt_timestamp_seconds{{{HOST}}}",
                   "{{instance}} {{receiver}} seconds since last attempt"),
        ], "short", w=12),
        table("Configuration", [
            target(f"gpumon_config_last_reload_successful{{{HOST}}}", instant=True, table=True),
            target(f"gpumon_config_last_reload_success_timestamp_seconds{{{HOST}}} * 1000", instant=True, table=True),
        ], description="Last reload (SIGHUP) applied (1) or rejected, the running configuration kept (0); "
           "when the running configuration was loaded.",
            hide=("Time", "__name__", "job"), rename={"Value #A": "last reload ok", "Value #B": "loaded at"},
            units={"loaded at": "dateTimeAsIso"}, w=8),
        timeseries("Exporter connections", [
            target(f"gpumon_http_connections_open{{{HOST}}}", "{{instance}} open connections"),
            target(f"increase(gpumon_http_connections_shed_total{{{HOST}}}[$__rate_interval])",
                   "{{instance}} connections shed (over the limit)"),
        ], "short", w=16),
    ]  # fmt: skip
    panels += unplaced_families(panels)
    return dashboard(
        "gpumon-gpu-detail",
        "gpumon / GPU detail",
        "Every metric gpumon exports for the selected hosts and GPUs, grouped, with the GPUs' own "
        "limits (slowdown temperature, power limit, max clocks, max PCIe link) drawn dashed.",
        panels,
        time_from="now-1h",
    )


# --- burn and energy ------------------------------------------------------------------------------------


def burn_energy() -> dict[str, Any]:
    cost = {
        "name": "cost_per_kwh",
        "label": "Cost per kWh",
        "type": "textbox",
        "query": "0.15",
        "current": {"text": "0.15", "value": "0.15"},
        "description": "Electricity price per kWh, in your currency; used by the cost panels.",
        "hide": 0,
    }
    panels = [
        row("Last burn-in verdicts"),
        stat("GPUs passing every test", f"count(min by (instance, gpu) (gpumon_burn_passed{{{SEL}}}) == 1) or vector(0)",
             steps=[(None, "green")], w=4),
        stat("GPUs failing a test", f"count(min by (instance, gpu) (gpumon_burn_passed{{{SEL}}}) == 0) or vector(0)",
             w=4),
        stat("Burn running now", f"sum(gpumon_burn_running{{{SEL}}}) or vector(0)", steps=[(None, "green"), (1, "orange")],
             w=4),
        stat("Last burn exit code", f"max(gpumon_burn_last_run_exit_code{{{HOST}}})",
             steps=[(None, "green"), (1, "red"), (3, "orange")], w=4,
             description="0 every test passed, 1 a fault was found, 3 nothing could be judged."),
        stat("Last burn finished", f"max(gpumon_burn_last_run_timestamp_seconds{{{HOST}}}) * 1000", "dateTimeFromNow",
             steps=[(None, "blue")], w=8),
        table("Verdict per GPU and test", [
            target(f"gpumon_burn_passed{{{SEL}}}", instant=True, table=True),
        ], hide=("Time", "__name__", "job"), rename={"Value": "passed"}, h=8),
        row("Performance history"),
        ts_burn("Matmul TFLOP/s", f"gpumon_burn_tflops{{{SEL}}}", "none", LEGEND + " {{dtype}}"),
        ts_burn("Memory and interconnect bandwidth", f"gpumon_burn_bandwidth_bytes_per_second{{{SEL}}}", "Bps",
                LEGEND + " {{test}} {{peer_gpu}}"),
        row("Energy"),
        timeseries("Power", [target(f"gpumon_power_watts{{{SEL}}}")], "watt", min_value=0),
        timeseries("Energy per interval", [
            target(f"increase(gpumon_energy_joules_total{{{SEL}}}[$__rate_interval]) / 3.6e6"),
        ], "kwatth", draw="bars", stack=True),
        stat("Energy in the time range", f"sum(increase(gpumon_energy_joules_total{{{SEL}}}[$__range])) / 3.6e6", "kwatth",
             steps=[(None, "blue")], w=8),
        stat("Cost in the time range", f"sum(increase(gpumon_energy_joules_total{{{SEL}}}[$__range])) / 3.6e6 * $cost_per_kwh",
             "none", steps=[(None, "blue")], w=8, description="Energy × the cost_per_kwh variable."),
        stat("Average power in the time range", f"sum(rate(gpumon_energy_joules_total{{{SEL}}}[$__range]))", "watt",
             steps=[(None, "blue")], w=8),
        row("Energy per job"),
        table("Energy and cost per job in the time range", [
            target(f"sort_desc(sum by (owner_kind, owner) (max_over_time(gpumon_owner_energy_joules_total{{{HOST}}}[$__range]))) / 3.6e6",
                   instant=True, table=True),
            target(f"sum by (owner_kind, owner) (max_over_time(gpumon_owner_energy_joules_total{{{HOST}}}[$__range])) / 3.6e6 * $cost_per_kwh",
                   instant=True, table=True),
        ], hide=("Time", "__name__", "job"), rename={"Value #A": "kWh", "Value #B": "cost"}, units={"kWh": "kwatth"},
            w=16, h=8,
            description="GPU energy of each Slurm job, pod, container or systemd unit (owner_kind none: processes of "
                        "none of them), summed over its hosts; a shared GPU splits by SM time share, else equally "
                        "(docs/fleet.md). Cost: energy × the cost_per_kwh variable."),
        stat("Jobs holding GPUs now", f"count(gpumon_owner_active{{{HOST}}} == 1) or vector(0)",
             steps=[(None, "blue")], w=8, h=8),
        timeseries("Power per job", [
            target(f"sum by (owner_kind, owner) (rate(gpumon_owner_energy_joules_total{{{HOST}}}[$__rate_interval]))",
                   "{{owner_kind}} {{owner}}"),
        ], "watt", min_value=0, w=24),
        timeseries("Cost per host per day at the current draw", [
            target(f"sum by (instance) (rate(gpumon_energy_joules_total{{{SEL}}}[$__rate_interval])) * 86400 / 3.6e6 * $cost_per_kwh",
                   "{{instance}}"),
        ], "none", min_value=0, w=24),
    ]  # fmt: skip
    return dashboard(
        "gpumon-burn-energy",
        "gpumon / Burn-in and energy",
        "Verdicts and figures of the last `gpumon burn` runs, and energy used with its cost.",
        panels,
        time_from="now-7d",
        extra_variables=[cost],
    )


def ts_burn(title: str, expr: str, unit: str, legend: str) -> Panel:
    return timeseries(title, [target(expr, legend)], unit, draw="points",
                      description="One point per scrape; values change after each burn run.")  # fmt: skip


DASHBOARDS = {
    "gpumon-fleet.json": fleet,
    "gpumon-gpu-detail.json": gpu_detail,
    "gpumon-burn-energy.json": burn_energy,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    for name, build in DASHBOARDS.items():
        (HERE / name).write_text(render(build), encoding="utf-8")
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()

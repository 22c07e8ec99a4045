"""The alerting: section: defaults, every problem listed at once, durations and templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.alerts.config import parse
from gpumon.alerts.config_values import format_duration, parse_duration
from gpumon.alerts.rules import PLACEHOLDERS, render, template_problems
from gpumon.config import file as gpumon_config
from tests.helpers import examples


def test_absent_section_means_builtin_pack_and_no_receivers() -> None:
    config, problems = parse(None)
    assert problems == [] and config is not None
    assert config.rules == () and config.alertmanagers == () and config.webhooks == ()
    assert "GpuLost" in {r.name for r in config.all_rules()}
    assert config.resend_interval_seconds == 60 and config.host_label == "host" and config.burn_hold_back


def test_a_full_section_parses() -> None:
    config, problems = parse(
        {
            "rules": [
                {
                    "name": "GpuHot",
                    "field": "temperature_celsius",
                    "op": ">",
                    "threshold": 85,
                    "clear_threshold": 80,
                    "for": "1m",
                    "keep_firing_for": "30s",
                    "severity": "critical",
                    "labels": {"team": "ml"},
                    "annotations": {"summary": "GPU {{ gpu }} at {{ value }}"},
                },
                {"name": "SmSlow", "field": "clocks_hertz.sm", "op": "<", "threshold": 1e9},
                {"name": "Replays", "field": "nvlink_errors_total.3.replay", "op": ">", "threshold": 0},
            ],
            "builtin": {"GpuMemoryHigh": False, "GpuLost": {"severity": "warning"}},
            "alertmanagers": ["http://am1:9093", "https://am2.example/prefix"],
            "webhooks": ["http://hooks.example/x"],
            "resend_interval": "2m",
            "host": "node-7",
            "retry": {"initial_backoff": "200ms", "max_backoff": "1m", "timeout": "3s"},
            "queue_capacity": 500,
            "burn_hold_back": False,
        }
    )
    assert problems == [] and config is not None
    hot = config.rules[0]
    assert (hot.for_seconds, hot.keep_firing_for_seconds, hot.clear_threshold) == (60, 30, 80)
    assert hot.burn_hold_back, "temperature rules are held back during burn by default"
    assert not config.rules[1].burn_hold_back
    names = {r.name: r for r in config.all_rules()}
    assert "GpuMemoryHigh" not in names and names["GpuLost"].severity == "warning"
    assert config.retry.initial_backoff_seconds == 0.2 and config.resend_interval_seconds == 120


def test_every_problem_is_listed_at_once() -> None:
    config, problems = parse(
        {
            "rules": [
                {"name": "A", "field": "no_such_field", "op": ">", "threshold": 1},
                {"name": "B", "field": "temperature_celsius", "op": "=>", "threshold": 1},
                {"name": "C", "field": "temperature_celsius", "op": ">", "threshold": 1, "for": "5 minutes"},
                {"name": "D", "field": "temperature_celsius", "op": ">", "threshold": 1, "severity": "page"},
                {
                    "name": "E",
                    "field": "temperature_celsius",
                    "op": ">",
                    "threshold": 1,
                    "annotations": {"summary": "{{ gpuu }}"},
                },
                {"name": "F", "kind": "gpu_on_fire"},
                {"name": "G", "field": "temperature_celsius", "op": ">", "threshold": 1, "colour": "red"},
                {"name": "GpuLost", "field": "up", "op": "==", "threshold": False},
            ],
            "alertmanagers": ["am1:9093"],
            "webhooks": ["http://ok.example", "ftp://bad.example"],
            "resend_interval": "10s",
            "frobnicate": True,
        }
    )
    assert config is None
    text = "\n".join(problems)
    for expected in [
        "rules[0](A): unknown field 'no_such_field'",
        "rules[1](B): op must be one of",
        "rules[2](C): for must be a duration",
        "rules[3](D): severity must be one of critical, warning, info",
        "rules[4](E): annotations.summary: template '{{ gpuu }}': unknown placeholder 'gpuu'",
        "rules[5](F): unknown kind 'gpu_on_fire'",
        "rules[6](G): unknown key 'colour'",
        "rules[7](GpuLost): name is already used by a built-in rule",
        "alertmanagers[0]: URL 'am1:9093' must be http:// or https://",
        "webhooks[1]: URL 'ftp://bad.example'",
        "resend_interval must be a duration from 30s to 3m",
        "unknown key 'frobnicate'",
    ]:
        assert expected in text, f"{expected!r} missing from:\n{text}"
    assert len(problems) == 12


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"field": "clocks_hertz", "op": ">", "threshold": 1}, "is a mapping"),
        ({"field": "nvlink_errors_total.3", "op": ">", "threshold": 1}, "takes 2 key(s)"),
        ({"field": "temperature_celsius", "op": ">", "threshold": 80, "clear_threshold": 90}, "must not be above"),
        ({"field": "temperature_celsius", "op": "==", "threshold": 80, "clear_threshold": 70}, "needs op"),
        ({"field": "temperature_celsius", "op": ">", "threshold": 1, "labels": {"gpu": "x"}}, "cannot be overridden"),
        ({"kind": "xid", "for": "1m"}, "'for' does not apply"),
        ({"kind": "nvml_down", "field": "up"}, "does not apply to kind nvml_down"),
        ({"kind": "stale_snapshot"}, "stale_snapshot rules need threshold"),
        ({"kind": "pcie_degraded", "min_utilization": 5}, "min_utilization must be a ratio"),
        ({"field": "temperature_celsius", "op": ">", "threshold": 1, "annotations": {"s": "{{ gpu"}}, "unbalanced"),
    ],
)
def test_rule_problems(rule: dict[str, Any], problem: str) -> None:
    config, problems = parse({"rules": [{"name": "R", **rule}]})
    assert config is None
    assert any(problem in p for p in problems), problems


def test_builtin_override_problems() -> None:
    _, problems = parse({"builtin": {"NoSuchRule": False, "GpuLost": {"field": "x"}, "GpuMemoryHigh": {"for": "x"}}})
    text = "\n".join(problems)
    assert "no built-in rule named 'NoSuchRule'" in text
    assert "builtin.GpuLost: key 'field' cannot be overridden" in text
    assert "GpuMemoryHigh): for must be a duration" in text


def test_gpumon_config_load_reports_alerting_problems_with_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "gpumon.yaml"
    path.write_text("alerting:\n  rules:\n    - {name: X, field: nope, op: '>', threshold: 1}\n  webhooks: [nope]\n")
    with pytest.raises(gpumon_config.ConfigError) as err:
        gpumon_config.load(path, env={})
    assert len(err.value.problems) == 2
    assert all(p.startswith(f"{path}: ") and ": alerting." in p for p in err.value.problems)  # after line, column


def test_gpumon_config_load_gives_an_alerting_config(tmp_path: Path) -> None:
    path = tmp_path / "gpumon.yaml"
    path.write_text("alerting:\n  alertmanagers: [http://127.0.0.1:9093]\n")
    config = gpumon_config.load(path, env={})
    assert config.alerting.alertmanagers == ("http://127.0.0.1:9093",)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("1h", 3600), ("1h30m", 5400), ("500ms", 0.5), (90, 90), (1.5, 1.5), ("0s", 0)],
)
def test_durations(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5x", "m", "-1s", "1m1h", "1.5m", True, None, [], -3])
def test_not_durations(text: Any) -> None:
    assert parse_duration(text) is None


@given(st.integers(min_value=0, max_value=10**9))
def test_duration_round_trip(ms: int) -> None:
    assert parse_duration(format_duration(ms / 1000)) == pytest.approx(ms / 1000)


@given(st.text(max_size=40))
def test_duration_parser_never_raises(text: str) -> None:
    value = parse_duration(text)
    assert value is None or value >= 0


@given(st.text(max_size=60))
def test_template_checker_never_raises_and_render_only_substitutes(text: str) -> None:
    problems = template_problems(text)
    if not problems:
        assert render(text, {}) == render(text, {"unused": "x"})


@given(st.sampled_from(PLACEHOLDERS), st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=20))
def test_known_placeholders_render_their_value(name: str, value: str) -> None:
    template = f"[{{{{ {name} }}}}]"
    assert template_problems(template) == []
    assert render(template, {name: value}) == f"[{value}]"


def test_render_runs_no_code() -> None:
    assert template_problems("{{ __import__('os') }}")
    assert render("{{ gpu.__class__ }}", {"gpu": "0"}) == "{{ gpu.__class__ }}"


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from([">", "==", "5m", "30s", "http://127.0.0.1:9093", "temperature_celsius", "xid", "GpuLost"]),
)
_keys = st.sampled_from(
    [
        "rules",
        "builtin",
        "builtin_rules",
        "alertmanagers",
        "webhooks",
        "resend_interval",
        "retry",
        "host",
        "name",
        "field",
        "op",
        "threshold",
        "for",
        "kind",
        "labels",
        "annotations",
        "severity",
        "GpuLost",
        "zzz",
    ]
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4), max_leaves=12
)


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(_keys, _values, max_size=6))
def test_parse_never_raises_and_gives_a_config_or_problems(raw: dict[str, Any]) -> None:
    config, problems = parse(raw)
    assert (config is None) == bool(problems)
    assert all(isinstance(p, str) and p.startswith("alerting") for p in problems)


def test_receivers_take_tls_and_auth_options_as_a_mapping(tmp_path: Path) -> None:
    ca, token = tmp_path / "ca.pem", tmp_path / "token"
    ca.write_text("x")
    token.write_text("t")
    cfg, problems = parse(
        {
            "alertmanagers": [{"url": "https://am:9093", "ca_file": str(ca), "bearer_token_file": str(token)}],
            "webhooks": ["http://hooks/plain"],
        }
    )
    assert problems == [] and cfg is not None
    assert cfg.alertmanagers == ("https://am:9093",) and cfg.webhooks == ("http://hooks/plain",)
    options = cfg.receiver_http["https://am:9093"]
    assert (options.ca_file, options.bearer_token_file, options.cert_file) == (str(ca), str(token), None)
    assert "http://hooks/plain" not in cfg.receiver_http


def test_receiver_option_problems_are_all_listed(tmp_path: Path) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("x")
    cfg, problems = parse(
        {
            "webhooks": [
                {"url": "http://hooks/a", "ca_file": str(tmp_path / "missing.pem"), "proxy": "x"},
                {"url": "https://hooks/b", "cert_file": str(cert)},
                {"ca_file": str(cert)},
            ]
        }
    )
    assert cfg is None
    assert problems == [
        "alerting.webhooks[0]: unknown key 'proxy' (known: url, ca_file, cert_file, key_file, bearer_token_file)",
        f"alerting.webhooks[0]: ca_file '{tmp_path / 'missing.pem'}' is not a readable file",
        "alerting.webhooks[0]: ca_file, cert_file and key_file need an https:// URL",
        "alerting.webhooks[1]: cert_file and key_file go together (a client certificate and its key)",
        "alerting.webhooks[2]: URL must be a string, got None",
    ]


_yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12))
_receiver_items = st.one_of(
    _yaml_scalars,
    st.dictionaries(
        st.sampled_from(["url", "ca_file", "cert_file", "key_file", "bearer_token_file", "other"]),
        st.one_of(_yaml_scalars, st.sampled_from(["https://am:9093", "/etc/hostname", "/nonexistent"])),
        max_size=6,
    ),
)


@settings(max_examples=examples(200))
@given(st.one_of(_yaml_scalars, st.lists(_receiver_items, max_size=4)))
def test_receiver_lists_of_any_shape_give_problems_never_exceptions(receivers: Any) -> None:
    cfg, problems = parse({"alertmanagers": receivers, "webhooks": receivers})
    assert (cfg is None) == bool(problems)
    if cfg is not None:
        assert set(cfg.receiver_http) <= set(cfg.alertmanagers) | set(cfg.webhooks)

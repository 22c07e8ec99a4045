"""Metric families as plain tuples, and their fast Prometheus text-format (0.0.4) rendering.

Every metric source of the daemon (gpumon's own table, alerts, burn results, read errors,
health, the DCGM names) builds ``Family`` objects; ``render`` writes them with one prepared
template per family, byte for byte what ``prometheus_client.generate_latest`` writes for the
same data (tests check this through ``registry.FamilyMetric``), several times faster: prometheus_client
renders about 7 µs per sample on a small CPU, and a host with many GPUs has tens of thousands.
gpumon.exposition.openmetrics renders the same families as OpenMetrics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from gpumon.model.families import Family

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_label(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def needs_escaping(values: Iterable[str]) -> bool:
    """Whether any of ``values`` holds a backslash, quote or newline (``plain_labels`` is False then)."""
    return any("\\" in v or '"' in v or "\n" in v for v in values)


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _template(fam: Family) -> str:
    """A str.format template that writes labels sorted by name, as prometheus_client does."""
    names = fam.label_names
    order = sorted(range(len(names)), key=lambda i: names[i])
    name = fam.name.replace("{", "{{").replace("}", "}}")
    if not names:
        return name + " {0}\n"
    value_slot = "{" + str(len(names)) + "}"
    return name + "{{" + ",".join(f'{names[i]}="{{{i}}}"' for i in order) + "}} " + value_slot + "\n"


def go_float(value: float) -> str:
    """A sample value as Prometheus writes it (Go's float formatting): ``+Inf``, ``-Inf``, ``NaN``,
    Python's shortest repr otherwise, with an exponent from 1e7 up (``12345678.0`` is
    ``1.2345678e+07``). The same text as ``prometheus_client.utils.floatToGoString``, which the
    tests hold it to over every float; gpumon writes it here so that the daemon does not import
    prometheus_client, whose package import loads its HTTP servers and clients (~2 MiB resident).
    An int is written as its float (``5`` as ``5.0``), as there."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _zero(value: float) -> str:
    """0.0 and -0.0 are one key of the value-text cache, but two texts."""
    return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"


def sample_template(fam: Family) -> Callable[..., str]:
    """The function that writes one sample line of ``fam``: ``template(*label_values, value_text)``
    (for ``render_samples``, which makes it each call unless given one made before)."""
    return _template(fam).format


def render_samples(
    fam: Family, out: list[str], formatted: dict[float, str], template: Callable[..., str] | None = None
) -> None:
    """Append one line per sample of ``fam`` to ``out`` (the same in text 0.0.4 and OpenMetrics);
    ``formatted`` caches value texts (zeros aside) across families; ``template``: ``fam``'s
    ``sample_template``, when the caller keeps it."""
    if fam.optional_labels:
        _render_sparse_samples(fam, out, formatted)
        return
    sample_lines(fam.samples, template or _template(fam).format, fam.plain_labels, out, formatted)


def sample_lines(
    samples: Iterable[tuple[tuple[str, ...], float]],
    template: Callable[..., str],
    plain_labels: bool,
    out: list[str],
    formatted: dict[float, str],
) -> None:
    """Append the line of each of ``samples`` (label values, value) to ``out``, written by
    ``template`` (a family's ``sample_template``); labels are escaped unless ``plain_labels``."""
    for labels, value in samples:
        text = formatted.get(value) if value else _zero(value)
        if text is None:
            text = formatted[value] = go_float(value)
        if labels and not plain_labels:
            labels = tuple(_escape_label(v) for v in labels)
        out.append(template(*labels, text))


def _render_sparse_samples(fam: Family, out: list[str], formatted: dict[float, str]) -> None:
    names, optional = fam.label_names, fam.optional_labels
    for labels, value in fam.samples:
        text = formatted.get(value) if value else _zero(value)
        if text is None:
            text = formatted[value] = go_float(value)
        pairs = sorted((k, v) for k, v in zip(names, labels, strict=True) if v or k not in optional)
        if pairs:
            label_text = ",".join(f'{k}="{_escape_label(v)}"' for k, v in pairs)
            out.append(f"{fam.name}{{{label_text}}} {text}\n")
        else:
            out.append(f"{fam.name} {text}\n")


def header(fam: Family) -> str:
    """The HELP and TYPE lines of ``fam`` (its text is these, then its sample lines)."""
    return f"# HELP {fam.name} {_escape_help(fam.help)}\n# TYPE {fam.name} {fam.kind}\n"


Heads = dict[tuple[str, str, str, tuple[str, ...]], tuple[str, Callable[..., str]]]
"""Families' HELP and TYPE lines and sample templates by (name, kind, help, label names), for a
caller that renders families made anew for every scrape (the same names and HELP each time)."""


def render(families: Iterable[Family], heads: Heads | None = None) -> str:
    """Text exposition of ``families``, each with its HELP and TYPE lines. Each family's text is
    kept on it (``rendered``): a family reused by later scrapes renders once. ``heads``: where the
    caller keeps the HELP and TYPE lines and templates of families it makes again every time.
    A family without samples is left out (HELP and TYPE alone make validators complain)."""
    out: list[str] = []
    formatted: dict[float, str] = {}
    for fam in families:
        if not fam.samples:
            continue
        text = fam.rendered
        if text is None:
            if heads is None:
                head, template = header(fam), None
            else:
                key = (fam.name, fam.kind, fam.help, fam.label_names)
                head, template = heads.get(key) or heads.setdefault(key, (header(fam), sample_template(fam)))
            lines = [head]
            render_samples(fam, lines, formatted, template)
            text = fam.rendered = "".join(lines)
            fam.seal()
        out.append(text)
    return "".join(out)

"""OpenMetrics 1.0 text rendering of metric families (gpumon.model.families.Family), byte for
byte as ``prometheus_client.openmetrics.exposition.generate_latest`` writes the same families,
several times faster.

prometheus_client escapes every sample name character by character (to cope with UTF-8
names); gpumon's names are plain ``[a-zA-Z_][a-zA-Z0-9_]*``, which need no escaping, so each
family is written with one template, and its text kept on the family (families reused across
scrapes render once). Tests compare both outputs over gpumon's metrics.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpumon.exposition.text import Heads, header, render_samples, sample_template
from gpumon.model.families import Family

CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
"""prometheus_client's ``openmetrics.exposition.CONTENT_TYPE_LATEST`` (tests hold it to that)."""

EOF = "# EOF\n"
"""The line that ends an OpenMetrics exposition."""
_TYPES = {"untyped": "unknown"}


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def om_header(fam: Family) -> str:
    """The HELP and TYPE lines of ``fam`` in OpenMetrics text, under the family name (a counter's
    without ``_total``)."""
    name = fam.family_name
    return f"# HELP {name} {_escape_help(fam.help)}\n# TYPE {name} {_TYPES.get(fam.kind, fam.kind)}\n"


def render_family(fam: Family, formatted: dict[float, str] | None = None) -> str:
    """``fam`` in OpenMetrics text: HELP and TYPE under the family name (a counter's without
    ``_total``), then its samples. The sample lines are the text format's: those of a family
    rendered in it already (``rendered``) are taken from there."""
    head = om_header(fam)
    text_header = header(fam)
    if fam.rendered is not None and fam.rendered.startswith(text_header):
        return head + fam.rendered[len(text_header) :]
    out = [head]
    render_samples(fam, out, {} if formatted is None else formatted)
    return "".join(out)


def render_text(families: Iterable[Family], heads: Heads | None = None) -> str:
    """The OpenMetrics text of ``families`` without the closing ``# EOF`` (a part of an exposition).
    Each family's text is kept on it (``rendered_openmetrics``). ``heads``: where the caller keeps
    the HELP and TYPE lines and templates of families it makes again every time (as for
    ``text.render``, in OpenMetrics). A family without samples is left out: the official
    OpenMetrics validator rejects metadata without a sample ("metric name changed")."""
    out: list[str] = []
    formatted: dict[float, str] = {}
    for family in families:
        if not family.samples:
            continue
        text = family.rendered_openmetrics
        if text is None:
            if heads is None:
                text = render_family(family, formatted)
            else:
                key = (family.name, family.kind, family.help, family.label_names)
                head, template = heads.get(key) or heads.setdefault(key, (om_header(family), sample_template(family)))
                lines = [head]
                render_samples(family, lines, formatted, template)
                text = "".join(lines)
            family.rendered_openmetrics = text
            family.seal()
        out.append(text)
    return "".join(out)


def render(families: Iterable[Family]) -> bytes:
    """The OpenMetrics exposition of ``families``, ending in ``# EOF``."""
    return (render_text(families) + EOF).encode()

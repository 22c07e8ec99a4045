""" "Did you mean": an unknown key or variable in the configuration, with the known one it is closest to.

``with_suggestions`` adds ``; did you mean 'enabled'?`` to each "unknown key" problem whose key is
close to one the section accepts: those its message lists, else the ones the caller gives for the
top level, a rule, or the ``GPUMON_*`` variables (difflib's similarity, 0.6 or more).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection

_UNKNOWN = re.compile(
    r"(?:unknown (key|variable)|no built-in rule named) (?:exporter\.)?'?([^'\s(]+)'?(?: \((?:known: )?([^)]*)\))?"
)
_IN_RULE = re.compile(r"alerting\.(?:rules\[\d+\]|builtin\.)")


def with_suggestions(
    problems: list[str], top_level: Collection[str], rule_keys: Collection[str], variables: Collection[str]
) -> list[str]:
    """``problems`` with the closest known key after each unknown one, where one is close."""
    out = []
    for problem in problems:
        match = _UNKNOWN.search(problem)
        if match is not None:
            kind, word, listed = match.groups()
            if listed:
                candidates: Collection[str] = [c.strip() for c in listed.split(",") if c.strip()]
            elif kind == "variable":
                candidates = variables
            elif _IN_RULE.search(problem[: match.start()]):
                candidates = rule_keys
            else:
                candidates = top_level
            close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
            if close and close[0] != word:
                problem += f"; did you mean {close[0]!r}?"
        out.append(problem)
    return out

"""Properties of the two small parsers of error text (hypothesis): "did you mean" only ever appends
to a problem, never loses or changes one; a duration in words is never empty and never negative."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpumon.config.suggest import with_suggestions
from gpumon.util.net_words import duration_words

KEYS = ["interval_seconds", "enabled", "window_seconds", "severity", "listen"]
problem = st.one_of(
    st.text(max_size=120),
    st.builds(
        lambda w, k: f"x.yaml: unknown key {w!r} (known: {', '.join(k)})",
        st.text(max_size=30),
        st.lists(st.sampled_from(KEYS)),
    ),
    st.builds(lambda w: f"environment: unknown variable {w!r}", st.text(max_size=30)),
)


@given(st.lists(problem, max_size=8))
def test_suggestions_only_append_to_each_problem(problems: list[str]) -> None:
    out = with_suggestions(problems, KEYS, KEYS, ["GPUMON_LISTEN"])
    assert len(out) == len(problems)
    for before, after in zip(problems, out, strict=True):
        assert after.startswith(before)
        assert after == before or after[len(before) :].startswith("; did you mean ")


@given(st.floats(min_value=-1e9, max_value=1e12, allow_nan=False))
def test_a_duration_in_words_is_a_number_and_a_unit(seconds: float) -> None:
    words = duration_words(seconds)
    assert words and words[0].isdigit() and words.split()[-1] in ("s", "min", "h", "d")

"""The ``--mesh`` text, property-based: any text is a layout or one refusal line naming it, never another error.

Text is drawn from anything (control characters, surrogates' neighbours, other scripts' digits) and from the
layout grammar's own characters with lookalikes mixed in (``２``, ``٢``, ``²``, ``TP``, a second ``=``, spaces), so
that most draws come close to a layout. What parses is a layout of known names, each once, sizes from 1 to
:data:`MAX_SIZE` or a single -1, and reads back the same from its own text. The CLI's refusals of the same texts
are rows of tests/e2e/test_reliability_badinput.py.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from numarun.errors import LayoutError
from numarun.layout import DIMS, MAX_SIZE, Layout

NEAR = st.lists(
    st.sampled_from([*DIMS, "TP", "Pp", "=", "==", ",", ",,", " ", "\t", "-", "+", "-1", "0", "1", "2",
                              "4", "9" * 12, "\uff12", "\u0662", "\u00b2", "_", ";", "\n", "\x00", "tp\u200b"]),
    max_size=16,
).map("".join)  # fmt: skip


def _check(text: str, where: str = "--mesh") -> None:
    try:
        spec = Layout.parse(text, where)
    except LayoutError as e:
        line = str(e)
        assert "\n" not in line and line.startswith(f"bad {where} {text!r}: ") and "expected" in line, line
        return
    assert spec.names and len(set(spec.names)) == len(spec.names) and set(spec.names) <= set(DIMS)
    assert all(s == -1 or 1 <= s <= MAX_SIZE for s in spec.shape) and list(spec.shape).count(-1) <= 1
    assert Layout.parse(spec.text, where) == spec


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_any_text_is_a_layout_or_one_line_naming_it(text: str) -> None:
    _check(text)


@settings(max_examples=600, deadline=None)
@given(NEAR, st.sampled_from(["--mesh", "NUMARUN_MESH", "launcher.mesh"]))
def test_text_close_to_a_layout_is_a_layout_or_one_line_naming_it(text: str, where: str) -> None:
    _check(text, where)


@settings(max_examples=200, deadline=None)
@given(
    st.permutations(DIMS).flatmap(
        lambda names: st.tuples(
            st.just(names[: len(names) - 2]),
            st.lists(st.integers(1, MAX_SIZE), min_size=3, max_size=3),
            st.sampled_from([" ", "", "  "]),
        )
    )
)
def test_a_layout_reads_back_from_its_text_with_any_spacing(drawn: tuple[tuple[str, ...], list[int], str]) -> None:
    names, sizes, pad = drawn
    text = ",".join(f"{pad}{n}{pad}={pad}{s}{pad}" for n, s in zip(names, sizes))
    spec = Layout.parse(text)
    assert spec.names == tuple(names) and list(spec.shape) == sizes[: len(names)]

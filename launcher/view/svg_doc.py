"""One writer for numarun's SVG documents (pure): the topology and plan pictures (:mod:`numarun.view.svg`), the step
report's picture (:mod:`numarun.view.steps_picture`) and tune's chart (:mod:`numarun.tune.chart`) draw on a
:class:`Canvas`.

An element carries its class (what tools and tests look for, and what the document's style sheet colours), its
``data-`` attributes and, where it has one, a tooltip: a ``<title>`` child, which a browser shows on hover. Text and
attributes are escaped here, never by the caller; coordinates and sizes are written by :func:`num`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from xml.sax.saxutils import escape

Value = str | int | float | None
"""An attribute's value: a float is written by :func:`num`; None leaves the attribute out."""
Data = Mapping[str, Value]
"""``data-`` attributes by name (``{"rank": 3}`` is ``data-rank="3"``)."""

BASE_STYLE = (
    "text { font-family: monospace; font-size: 11px; fill: #000; }\n"
    "text.title { font-weight: bold; }\n"
    "rect.background { fill: #fff; }\n"
)
"""What every document's style sheet starts with; a writer's own rules follow it."""


def num(value: float) -> str:
    """A coordinate or a size: at most two decimals, no trailing zeros (``12``, ``12.5``, ``0.25``)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def clip(text: str, chars: int) -> str:
    """``text`` cut to ``chars`` characters, a ``+`` marking the cut."""
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "+"


def _value(value: str | int | float) -> str:
    return num(value) if isinstance(value, float) else escape(str(value), {'"': "&quot;"})


def _attributes(cls: str, data: Data | None, attrs: Mapping[str, Value]) -> str:
    """`` class="..." data-...="..." x="..."``: ``data`` and ``attrs`` in their order, an underscore in a name
    written as a dash (``text_anchor``); empty classes and None values left out."""
    named = {"class": cls or None, **{f"data-{k}": v for k, v in (data or {}).items()}, **attrs}
    return "".join(f' {k.replace("_", "-")}="{_value(v)}"' for k, v in named.items() if v is not None)


class Canvas:
    """A document being drawn: elements in the order they are drawn (later ones on top), then :meth:`document`."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def _element(self, tag: str, cls: str, data: Data | None, attrs: Mapping[str, Value], content: str = "") -> None:
        attributes = _attributes(cls, data, attrs)
        self._parts.append(f"<{tag}{attributes}>{content}</{tag}>" if content else f"<{tag}{attributes}/>")

    @staticmethod
    def _tip(tip: str) -> str:
        return f"<title>{escape(tip)}</title>" if tip else ""

    def rect(
        self,
        x: float,
        y: float,
        width: float,
        height: float,
        *,
        cls: str = "",
        data: Data | None = None,
        tip: str = "",
        **attrs: Value,
    ) -> None:
        self._element("rect", cls, data, {"x": x, "y": y, "width": width, "height": height, **attrs}, self._tip(tip))

    def text(
        self,
        x: float,
        y: float,
        content: object,
        *,
        cls: str = "",
        data: Data | None = None,
        tip: str = "",
        anchor: str | None = None,
        preserve: bool = False,
        **attrs: Value,
    ) -> None:
        """``content`` at ``x`` (its start, or its middle or end by ``anchor``) on the baseline ``y``; ``preserve``
        keeps its runs of spaces."""
        geometry: dict[str, Value] = {"xml:space": "preserve" if preserve else None, "x": x, "y": y}
        self._element(
            "text", cls, data, {**geometry, "text_anchor": anchor, **attrs}, escape(str(content)) + self._tip(tip)
        )

    def line(
        self, x1: float, y1: float, x2: float, y2: float, *, cls: str = "", data: Data | None = None, **attrs: Value
    ) -> None:
        self._element("line", cls, data, {"x1": x1, "y1": y1, "x2": x2, "y2": y2, **attrs})

    def path(self, d: str, *, cls: str = "", data: Data | None = None, tip: str = "", **attrs: Value) -> None:
        """A path of ``d``, written by its drawer with :func:`num` (``f"M{num(x)} {num(y)}h{num(w)}"``)."""
        self._element("path", cls, data, {**attrs, "d": d}, self._tip(tip))

    @contextlib.contextmanager
    def group(self, *, cls: str = "", data: Data | None = None, tip: str = "") -> Iterator[None]:
        """A ``<g>`` holding what is drawn inside the ``with``; ``tip`` is the whole group's tooltip."""
        self._parts.append(f"<g{_attributes(cls, data, {})}>{self._tip(tip)}")
        yield
        self._parts.append("</g>")

    def document(self, width: float, height: float, *, title: str, style: str = "") -> str:
        """A standalone SVG document (UTF-8 text, no external references) of what was drawn, on a white page of
        whole pixels; ``title`` names it, ``style`` follows :data:`BASE_STYLE` in its style sheet."""
        w, h = math.ceil(width), math.ceil(height)
        return "\n".join(
            [
                '<?xml version="1.0" encoding="UTF-8"?>',
                f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">',
                f"<title>{escape(title)}</title>",
                f"<style>\n{BASE_STYLE}{style}</style>",
                f'<rect class="background" x="0" y="0" width="{w}" height="{h}"/>',
                *self._parts,
                "</svg>\n",
            ]
        )

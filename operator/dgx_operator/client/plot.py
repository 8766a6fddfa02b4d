"""Pictures of a run's progress history: loss (with eval loss), learning rate and throughput
against step, as a text chart for a terminal or a log file (:func:`text`), a self-contained HTML
page with one inline SVG per panel (:func:`html`, or :func:`svg` for one image) and a PNG
(:func:`png`, with matplotlib, the ``plot`` extra).

Pure: the points in (:class:`dgx_api.history.Point`), the picture out. matplotlib is imported only
inside :func:`png`, so the rest works without it. A panel whose series has no value (a run that
reports no tokens, a trainer without evaluation) is left out, never drawn empty.

:func:`png` returns where it drew everything, in the image's pixels (origin top left): each
panel's axes box, its limits, each series' points and the boxes of the title, axis labels, tick
labels and legend entries; the same JSON is in the PNG itself, a ``tEXt`` chunk keyed
:data:`LAYOUT_KEY`, so a test (or a reader) can check the picture against the data.
"""

from __future__ import annotations

import html as _html
import itertools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dgx_api.history import Point

#: The PNG ``tEXt`` keyword of the layout :func:`png` writes into the image.
LAYOUT_KEY: Final = "kubedgx-layout"
#: What :func:`write` can write, by the file's suffix.
SUFFIXES: Final = (".png", ".html", ".svg")
NO_POINTS: Final = "no progress reported yet"
DPI: Final = 100


class PlotError(Exception):
    """Nothing to draw, or no way to draw it here; the message says what to do."""


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    #: (step, value), sorted by step, one per step (the last report of a step wins).
    data: tuple[tuple[int, float], ...]
    #: Drawn as markers (an evaluation is rarer than a progress line) rather than as a line alone.
    markers: bool = False


@dataclass(frozen=True)
class Panel:
    name: str
    ylabel: str
    series: tuple[Series, ...]

    @property
    def ylim(self) -> tuple[float, float]:
        values = [v for s in self.series for _, v in s.data]
        return min(values), max(values)


# Colour-blind-safe and distinct from each other and from the grey of the axes (Okabe-Ito).
LOSS_COLOUR: Final = "#0072b2"
EVAL_COLOUR: Final = "#d55e00"
LR_COLOUR: Final = "#009e73"
THROUGHPUT_COLOUR: Final = "#cc79a7"


def _series(points: Sequence[Point], name: str, colour: str, value: Callable[[Point], float | None]) -> Series:
    by_step: dict[int, float] = {}
    for point in points:
        v = value(point)
        if v is not None and math.isfinite(v):
            by_step[point.step] = float(v)
    return Series(name, colour, tuple(sorted(by_step.items())))


def panels(points: Sequence[Point]) -> list[Panel]:
    """The panels with something to draw, top to bottom; PlotError when there is none."""
    if not points:
        raise PlotError(NO_POINTS)
    loss = _series(points, "loss", LOSS_COLOUR, lambda p: p.loss)
    evals = _series(points, "eval loss", EVAL_COLOUR, lambda p: p.eval_loss)
    evals = Series(evals.name, evals.colour, evals.data, markers=True)
    rate = _series(points, "learning rate", LR_COLOUR, lambda p: p.learning_rate)
    tokens = _series(points, "tokens/s", THROUGHPUT_COLOUR, lambda p: p.tokens_per_second)
    samples = _series(points, "samples/s", THROUGHPUT_COLOUR, lambda p: p.samples_per_second)
    throughput = tokens if tokens.data else samples
    found = [
        Panel("loss", "loss", tuple(s for s in (loss, evals) if s.data)),
        Panel("learning rate", "learning rate", (rate,)),
        Panel("throughput", throughput.name, (throughput,)),
    ]
    kept = [p for p in found if any(s.data for s in p.series)]
    if not kept:
        raise PlotError(NO_POINTS)
    return kept


def _xlim(drawn: Sequence[Panel], pad: float = 0.02) -> tuple[float, float]:
    """The steps' range, ``pad`` wider on each side (a marker at the last step is whole, not cut by the frame)."""
    steps = [x for p in drawn for s in p.series for x, _ in s.data]
    lo, hi = min(steps), max(steps)
    return (lo - 1, hi + 1) if lo == hi else _padded(lo, hi, pad)


def _padded(lo: float, hi: float, fraction: float = 0.05) -> tuple[float, float]:
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    pad = (hi - lo) * fraction
    return lo - pad, hi + pad


def compact(value: float) -> str:
    """A number in at most about 7 characters, 4 significant digits: 2.451, 0.0002, 1.9e-05, 12346."""
    size = abs(value)
    if size == 0:
        return "0"
    if size >= 1e6:
        return f"{value:.3g}"
    if size >= 1:
        return f"{value:.{max(0, 3 - int(math.log10(size)))}f}"
    return f"{value:.4g}"


def _summary(points: Sequence[Point], drawn: Sequence[Panel]) -> list[tuple[str, str]]:
    """(name, last value) for the table and the text chart's header, the step first."""
    last = max(points, key=lambda p: p.step)
    total = next((p.total_steps for p in reversed(points) if p.total_steps), None)
    rows = [("step", f"{last.step}/{total}" if total else str(last.step))]
    for panel in drawn:
        for series in panel.series:
            step, value = series.data[-1]
            rows.append((series.name, compact(value) + ("" if step == last.step else f" (step {step})")))
    return rows


# -- text -------------------------------------------------------------------------------------------


def _col(x: float, lo: float, hi: float, cells: int) -> int:
    return round((x - lo) / (hi - lo) * (cells - 1))


def text(points: Sequence[Point], *, width: int = 80, height: int = 12) -> str:
    """A text chart per panel, ``height`` rows of plot and at most ``width`` characters a line, in
    plain ASCII (it survives any terminal and a log file). The highest value of a panel is on its top
    row and the lowest on its bottom row, labelled on the left; the step axis under it."""
    drawn = panels(points)
    height = max(3, height)
    xlo, xhi = _xlim(drawn, pad=0)
    lines = [""]
    for item in (f"{name} {value}" for name, value in _summary(points, drawn)):  # wrapped between items
        joined = f"{lines[-1]}  {item}" if lines[-1] else item
        if len(joined) <= width or not lines[-1]:
            lines[-1] = joined[:width]
        else:
            lines.append(item[:width])
    for panel in drawn:
        lo, hi = panel.ylim
        if lo == hi:
            lo, hi = _padded(lo, hi)
        top, bottom = compact(hi), compact(lo)
        label_width = max(len(top), len(bottom))
        cells = max(10, width - label_width - 2)
        grid = [[" "] * cells for _ in range(height)]

        def row(v: float, lo: float = lo, hi: float = hi, flat: bool = panel.ylim[0] == panel.ylim[1]) -> int:
            return (height - 1) // 2 if flat else round((hi - v) / (hi - lo) * (height - 1))

        for series in panel.series:
            mark = "o" if series.markers else "*"
            cells_of = [(_col(x, xlo, xhi, cells), row(v)) for x, v in series.data]
            if not series.markers:  # a line: the columns between two points interpolated
                for (c0, r0), (c1, r1) in itertools.pairwise(cells_of):
                    for c in range(c0 + 1, c1):
                        grid[round(r0 + (r1 - r0) * (c - c0) / (c1 - c0))][c] = mark
            for c, r in cells_of:
                grid[r][c] = mark
        legend = "   ".join(f"{'o' if s.markers else '*'} {s.name}" for s in panel.series)
        lines.append("")
        lines.append(f"{panel.name}: {legend}"[:width])
        for i, cells_row in enumerate(grid):
            label = top if i == 0 else bottom if i == height - 1 else ""
            lines.append(f"{label:>{label_width}} |{''.join(cells_row)}".rstrip())
        lines.append(" " * label_width + " +" + "-" * cells)
        first, last = str(math.ceil(xlo)), str(math.floor(xhi))
        middle = "step"
        gap = cells - len(first) - len(last)
        if gap >= len(middle) + 2:
            left = (gap - len(middle)) // 2
            axis = first + " " * left + middle + " " * (gap - len(middle) - left) + last
        else:
            axis = first + " " * max(1, gap) + last
        lines.append(" " * (label_width + 2) + axis)
    return "\n".join(lines) + "\n"


# -- SVG and HTML -----------------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, count: int = 5, *, integer: bool = False) -> list[float]:
    """Round values (1, 2, 2.5 or 5 times a power of ten apart) between lo and hi, about ``count``;
    whole numbers only with ``integer`` (steps)."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count - 1)
    if integer:
        raw = max(raw, 1.0)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw and (not integer or (m * power) % 1 == 0))
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + step * 1e-9:
        ticks.append(round(k * step, 12))
        k += 1
    return ticks


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Labels that tell the ticks apart with as few digits as that takes."""
    if len(ticks) < 2:
        return [compact(t) for t in ticks]
    step = min(abs(b - a) for a, b in itertools.pairwise(ticks)) or 1.0
    big = max(abs(t) for t in ticks)
    if big and (big < 1e-2 or big >= 1e6):
        mantissa_step = step / 10 ** math.floor(math.log10(big))  # 2.5e-06 against 5.5e-05: 0.25, two digits
        digits = next((d for d in range(10) if abs(round(mantissa_step, d) - mantissa_step) < mantissa_step * 1e-6), 10)
        return ["0" if t == 0 else f"{t:.{digits}e}" for t in ticks]
    decimals = next((d for d in range(10) if abs(round(step, d) - step) < step * 1e-6), 10)
    return [f"{t:.{decimals}f}" for t in ticks]


#: One panel's SVG: its size and the plot area's margins.
SVG_WIDTH: Final = 760
SVG_HEIGHT: Final = 250
MARGIN_LEFT: Final = 78
MARGIN_RIGHT: Final = 20
MARGIN_TOP: Final = 34
MARGIN_BOTTOM: Final = 46


def _f(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def scale(value: float, lo: float, hi: float, start: float, end: float) -> float:
    """``value`` in [lo, hi] mapped linearly to [start, end] (pixels), rounded as the SVG writes it."""
    return round(start + (value - lo) / (hi - lo) * (end - start), 2)


def panel_svg(panel: Panel, xlim: tuple[float, float], *, x: float = 0, y: float = 0, bottom: bool = True) -> str:
    """One panel: frame, grid, ticks and their labels, axis titles, legend, one polyline per series
    (and a circle per evaluation). The limits are on the element (``data-xlim``, ``data-ylim``) and
    the plot area is the ``rect`` of class ``plot-area``, so a reader can map pixels back to data."""
    esc = _html.escape
    left, right = MARGIN_LEFT, SVG_WIDTH - MARGIN_RIGHT
    top, base = MARGIN_TOP, SVG_HEIGHT - MARGIN_BOTTOM
    xlo, xhi = xlim
    ylo, yhi = _padded(*panel.ylim)
    parts = [
        f'<svg class="panel" data-panel="{esc(panel.name)}" x="{_f(x)}" y="{_f(y)}" width="{SVG_WIDTH}" '
        f'height="{SVG_HEIGHT}" viewBox="0 0 {SVG_WIDTH} {SVG_HEIGHT}" role="img" aria-label="{esc(panel.name)}" '
        f'data-xlim="{xlo!r} {xhi!r}" data-ylim="{ylo!r} {yhi!r}" font-family="sans-serif" font-size="12">',
        f'<rect x="0" y="0" width="{SVG_WIDTH}" height="{SVG_HEIGHT}" fill="#ffffff"/>',
    ]
    xticks = [t for t in nice_ticks(xlo, xhi, 8, integer=True) if xlo <= t <= xhi]
    for t, label in zip(xticks, tick_labels(xticks), strict=True):
        px = scale(t, xlo, xhi, left, right)
        parts.append(f'<line class="grid" x1="{_f(px)}" y1="{top}" x2="{_f(px)}" y2="{base}" stroke="#e5e5e5"/>')
        parts.append(f'<line x1="{_f(px)}" y1="{base}" x2="{_f(px)}" y2="{base + 5}" stroke="#333333"/>')
        parts.append(f'<text class="tick-x" x="{_f(px)}" y="{base + 18}" text-anchor="middle">{esc(label)}</text>')
    yticks = [t for t in nice_ticks(ylo, yhi, 6) if ylo <= t <= yhi]
    for t, label in zip(yticks, tick_labels(yticks), strict=True):
        py = scale(t, ylo, yhi, base, top)
        parts.append(f'<line class="grid" x1="{left}" y1="{_f(py)}" x2="{right}" y2="{_f(py)}" stroke="#e5e5e5"/>')
        parts.append(f'<line x1="{left - 5}" y1="{_f(py)}" x2="{left}" y2="{_f(py)}" stroke="#333333"/>')
        parts.append(f'<text class="tick-y" x="{left - 8}" y="{_f(py + 4)}" text-anchor="end">{esc(label)}</text>')
    parts.append(
        f'<rect class="plot-area" x="{left}" y="{top}" width="{right - left}" height="{base - top}" '
        'fill="none" stroke="#333333"/>'
    )
    if bottom:
        parts.append(
            f'<text class="axis-title x" x="{(left + right) / 2:g}" y="{SVG_HEIGHT - 8}" '
            'text-anchor="middle">step</text>'
        )
    parts.append(
        f'<text class="axis-title y" x="16" y="{(top + base) / 2:g}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(top + base) / 2:g})">{esc(panel.ylabel)}</text>'
    )
    parts.append(f'<text class="panel-title" x="{left}" y="20" font-weight="bold">{esc(panel.name)}</text>')
    legend_x = right
    for series in reversed(panel.series):  # right-aligned, in order
        legend_x -= 14 + 7 * len(series.name) + 18
        dash = ' stroke-dasharray="5 3"' if series.markers else ""
        parts.append(
            f'<g class="legend" data-series="{esc(series.name)}"><line x1="{legend_x}" y1="16" x2="{legend_x + 18}" '
            f'y2="16" stroke="{series.colour}" stroke-width="2"{dash}/>'
            + (f'<circle cx="{legend_x + 9}" cy="16" r="3.5" fill="{series.colour}"/>' if series.markers else "")
            + f'<text x="{legend_x + 24}" y="20">{esc(series.name)}</text></g>'
        )
    for series in panel.series:
        coords = [(scale(sx, xlo, xhi, left, right), scale(sy, ylo, yhi, base, top)) for sx, sy in series.data]
        points_attr = " ".join(f"{_f(px)},{_f(py)}" for px, py in coords)
        style = ' stroke-width="1" stroke-dasharray="5 3"' if series.markers else ' stroke-width="1.8"'
        parts.append(
            f'<polyline class="series" data-series="{esc(series.name)}" points="{points_attr}" fill="none" '
            f'stroke="{series.colour}"{style} stroke-linejoin="round"/>'
        )
        if series.markers:
            parts.extend(
                f'<circle class="marker" data-series="{esc(series.name)}" cx="{_f(px)}" cy="{_f(py)}" r="3.5" '
                f'fill="{series.colour}"/>'
                for px, py in coords
            )
    parts.append("</svg>")
    return "\n".join(parts)


def svg(points: Sequence[Point], *, title: str) -> str:
    """One standalone SVG image: the title, then the panels one under the other."""
    drawn = panels(points)
    xlim = _xlim(drawn)
    head = 36
    total = head + SVG_HEIGHT * len(drawn)
    body = [
        panel_svg(panel, xlim, y=head + i * SVG_HEIGHT, bottom=i == len(drawn) - 1) for i, panel in enumerate(drawn)
    ]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" height="{total}" '
        f'viewBox="0 0 {SVG_WIDTH} {total}" font-family="sans-serif">\n'
        f'<rect width="{SVG_WIDTH}" height="{total}" fill="#ffffff"/>\n'
        f'<text x="{MARGIN_LEFT}" y="24" font-size="16" font-weight="bold">{_html.escape(title)}</text>\n'
        + "\n".join(body)
        + "\n</svg>\n"
    )


#: The page's style sheet (inline): :func:`html`'s, and that of a page that embeds :func:`figures`.
STYLE: Final = """
body { font-family: sans-serif; margin: 1.5em; color: #222222; background: #ffffff; }
h1 { font-size: 1.3em; margin: 0 0 0.6em 0; }
svg.panel { display: block; margin-bottom: 0.5em; }
table { border-collapse: collapse; margin-top: 0.8em; }
th, td { padding: 0.2em 0.8em; border-bottom: 1px solid #dddddd; text-align: left; }
td.value { text-align: right; font-variant-numeric: tabular-nums; }
"""


def figures(points: Sequence[Point]) -> str:
    """The body of :func:`html`'s page without its title: an inline SVG per panel and the table of
    the last values, for a page of another's (the Flyte Deck) that uses :data:`STYLE`. PlotError
    when there is nothing to draw."""
    drawn = panels(points)
    xlim = _xlim(drawn)
    esc = _html.escape
    svgs = [panel_svg(panel, xlim, bottom=True) for panel in drawn]
    rows = "\n".join(
        f'<tr><th scope="row">{esc(name)}</th><td class="value">{esc(value)}</td></tr>'
        for name, value in _summary(points, drawn)
    )
    return "\n".join(svgs) + '\n<table class="last">\n<caption>last values</caption>\n' + rows + "\n</table>\n"


def html(points: Sequence[Point], *, title: str) -> str:
    """One self-contained page: an inline SVG per panel and a table of the last values. No script,
    no font, no style sheet or image from elsewhere: it opens offline and from an email. Well-formed
    XML after its doctype line, so a test (or a tool) can read it with any XML parser."""
    body = figures(points)
    esc = _html.escape
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8"/>\n'
        f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n" + body + "</body>\n</html>\n"
    )


# -- PNG --------------------------------------------------------------------------------------------


def _missing_matplotlib() -> PlotError:
    return PlotError(
        "drawing a PNG needs matplotlib: pip install 'kubedgx[plot]' "
        "(or write a .html file instead, which needs nothing)"
    )


def png(points: Sequence[Point], path: Path, *, title: str) -> dict[str, Any]:
    """Draw the panels to ``path`` (PNG, 100 dpi, no display needed) and return the layout: where
    each thing is, in the image's pixels from its top left corner, also written into the PNG as the
    ``tEXt`` chunk :data:`LAYOUT_KEY` (JSON)::

        {"size": [w, h], "title": {"text", "box"},
         "panels": [{"name", "axes": [x0, y0, x1, y1], "xlim": [lo, hi], "ylim": [lo, hi],
                     "ylabel": {"text", "box"}, "xlabel": {"text", "box"} | null,
                     "xticks": [{"text", "box"}], "yticks": [...], "legend": [...],
                     "series": [{"name", "colour", "data": [[step, value]], "pixels": [[x, y]]}]}]}
    """
    drawn = panels(points)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import Formatter, MaxNLocator
    except ImportError as exc:
        raise _missing_matplotlib() from exc

    class Labels(Formatter):
        """The tick labels the SVG writes: one style per axis, as few digits as tell them apart."""

        def __call__(self, x: float, pos: int | None = None) -> str:
            return compact(x)

        def format_ticks(self, values: Sequence[float]) -> list[str]:
            return tick_labels(list(values))

    xlim = _xlim(drawn)
    fig = Figure(figsize=(9, 0.9 + 2.5 * len(drawn)), dpi=DPI, layout="constrained")
    canvas = FigureCanvasAgg(fig)
    axes = fig.subplots(len(drawn), 1, sharex=True, squeeze=False)[:, 0]
    suptitle = fig.suptitle(title, fontsize=13)
    xlabel = None
    for i, (ax, panel) in enumerate(zip(axes, drawn, strict=True)):
        for series in panel.series:
            xs = [sx for sx, _ in series.data]
            ys = [sy for _, sy in series.data]
            if series.markers:  # under the loss line, which stays visible across it
                ax.plot(xs, ys, color=series.colour, linestyle="--", linewidth=1, marker="o", markersize=6,
                        label=series.name, zorder=2)  # fmt: skip
            else:  # a few reports: each one marked, so that a straight line is not mistaken for many
                ax.plot(xs, ys, color=series.colour, linewidth=1.6, label=series.name, zorder=3,
                        marker="o" if len(xs) <= 40 else None, markersize=3)  # fmt: skip
        ax.set_xlim(*xlim)
        ax.set_ylim(*_padded(*panel.ylim))
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.name, loc="left", fontsize=11, fontweight="bold")
        ax.grid(True, color="#e5e5e5", linewidth=0.8, zorder=0)
        ax.tick_params(labelbottom=True)
        ax.yaxis.set_major_formatter(Labels())
        ax.xaxis.set_major_formatter(Labels())
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))  # steps are whole numbers
        # Above the axes, right: a legend never hides a point of the curve.
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=len(panel.series), frameon=False,
                  fontsize=9, borderaxespad=0.2)  # fmt: skip
        if i == len(drawn) - 1:
            xlabel = ax.set_xlabel("step")
    canvas.draw()  # type: ignore[no-untyped-call]
    fig.set_layout_engine("none")  # the layout found above is the one saved: the pixels stay where they are
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    height = fig.bbox.height

    def box(artist: Any) -> list[float]:
        b = artist.get_window_extent(renderer)
        return [round(b.x0, 2), round(height - b.y1, 2), round(b.x1, 2), round(height - b.y0, 2)]

    def labelled(artist: Any) -> dict[str, Any]:
        return {"text": artist.get_text(), "box": box(artist)}

    def ticks(locations: Sequence[float], labels: Sequence[Any], lo: float, hi: float) -> list[dict[str, Any]]:
        return [labelled(t) for loc, t in zip(locations, labels, strict=True) if lo <= loc <= hi and t.get_text()]

    layout: dict[str, Any] = {
        "size": [round(fig.bbox.width), round(height)],
        "title": labelled(suptitle),
        "panels": [],
    }
    for i, (ax, panel) in enumerate(zip(axes, drawn, strict=True)):
        legend = ax.get_legend()
        ylo, yhi = ax.get_ylim()
        series_layout = []
        for series in panel.series:
            shown = ax.transData.transform([[sx, sy] for sx, sy in series.data])
            series_layout.append(
                {
                    "name": series.name,
                    "colour": series.colour,
                    "data": [[sx, sy] for sx, sy in series.data],
                    "pixels": [[round(float(px), 2), round(float(height - py), 2)] for px, py in shown],
                }
            )
        layout["panels"].append(
            {
                "name": panel.name,
                "axes": box(ax.patch),
                "xlim": list(ax.get_xlim()),
                "ylim": [ylo, yhi],
                "ylabel": labelled(ax.yaxis.label),
                "xlabel": labelled(xlabel) if xlabel is not None and i == len(drawn) - 1 else None,
                "xticks": ticks(ax.get_xticks(), ax.get_xticklabels(), *ax.get_xlim()),
                "yticks": ticks(ax.get_yticks(), ax.get_yticklabels(), ylo, yhi),
                "legend": [labelled(t) for t in legend.get_texts()] if legend is not None else [],
                "series": series_layout,
            }
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI, metadata={LAYOUT_KEY: json.dumps(layout, separators=(",", ":"))})
    return layout


def write(points: Sequence[Point], path: Path, *, title: str) -> Path:
    """The picture the file's suffix names (.png, .html or .svg) written to ``path``."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise PlotError(f"{path.name}: cannot tell what to draw from its suffix; name a {', '.join(SUFFIXES)} file")
    if suffix == ".png":
        png(points, path, title=title)
        return path
    content = html(points, title=title) if suffix == ".html" else svg(points, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return path

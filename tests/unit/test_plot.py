"""The loss curve's pictures (dgx_operator.client.plot), looked at: the PNG decoded and checked pixel
by pixel against the data (each point of each curve is where the data puts it, in its colour; the
axes' frames are drawn; the tick labels, axis labels, legend and title are there, with the expected
texts), the HTML page's SVG read back as XML (each polyline's points are the data scaled into the
plot area), the text chart read by rows. A checker that is shown a picture of other data finds the
point that moved. And `kubedgx run --local`'s pictures from its progress lines.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import re
import struct
import sys
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dgx_api.history import Point, parse_lines
from dgx_operator.cli import local
from dgx_operator.client import plot

TOTAL = 100
EVAL_EVERY = 20
PEAK_LR = 2e-4
WARMUP = 10


def run_lines(total: int = TOTAL, seed: int = 33) -> list[str]:
    """A QLoRA-like run's stdout: the loss decaying with noise, an evaluation every 20 steps, a cosine
    learning rate after a warmup, about 1200 tokens/s; with the libraries' own lines among them."""
    rng = random.Random(seed)
    out = [
        json.dumps({"event": "start", "step": 0, "totalSteps": total}),
        "Loading checkpoint shards: 100%",
        "{'a': 1}",
    ]
    for step in range(1, total + 1):
        if step <= WARMUP:
            lr = PEAK_LR * step / WARMUP
        else:
            lr = PEAK_LR * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (total - WARMUP)))
        record = {
            "event": "progress",
            "step": step,
            "totalSteps": total,
            "epoch": round(step / 50, 4),
            "loss": round(0.85 + 1.6 * math.exp(-step / 22) + rng.gauss(0, 0.05), 4),
            "learningRate": lr,
            "tokensPerSecond": round(1200 + rng.gauss(0, 40), 1),
            "samplesPerSecond": round(2.3 + rng.gauss(0, 0.05), 3),
            "updatedAt": "2025-06-01T12:00:00Z",
        }
        out.append(json.dumps(record))
        if step % EVAL_EVERY == 0:
            eval_loss = round(0.95 + 1.5 * math.exp(-step / 22), 4)
            out.append(json.dumps({"event": "eval", "step": step, "totalSteps": total, "evalLoss": eval_loss}))
    return out


def run_points() -> list[Point]:
    return parse_lines(run_lines())


def expected(points: Sequence[Point], field: str) -> list[tuple[int, float]]:
    """(step, value) of one field, from the points themselves (not from the plot module)."""
    found: dict[int, float] = {}
    for p in points:
        value = getattr(p, field)
        if value is not None:
            found[p.step] = value
    return sorted(found.items())


SERIES_FIELDS = {
    "loss": "loss",
    "eval loss": "eval_loss",
    "learning rate": "learning_rate",
    "tokens/s": "tokens_per_second",
}


# --- the PNG, decoded ----------------------------------------------------------------------------


def png_texts(path: Path) -> dict[str, str]:
    """The PNG's text chunks (tEXt, zTXt, iTXt), read with struct and zlib: what the file carries."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    texts, at = {}, 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            texts[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            texts[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _language, _, rest = rest.partition(b"\0")
            _translated, _, value = rest.partition(b"\0")
            texts[key.decode("latin-1")] = (zlib.decompress(value) if compressed else value).decode("utf-8")
        at += 12 + length
    return texts


def pixels(path: Path) -> Any:
    """The PNG's pixels, rows top down, RGB in [0, 1]."""
    from matplotlib import image

    rgba = image.imread(str(path))
    assert rgba.ndim == 3, rgba.shape
    return rgba[:, :, :3]


def rgb(colour: str) -> tuple[float, float, float]:
    value = int(colour.lstrip("#"), 16)
    return ((value >> 16) / 255, ((value >> 8) & 255) / 255, (value & 255) / 255)


def to_pixel(panel: dict[str, Any], step: float, value: float) -> tuple[float, float]:
    """Where (step, value) belongs in the image, from the axes' box and limits alone."""
    x0, top, x1, bottom = panel["axes"]
    (xlo, xhi), (ylo, yhi) = panel["xlim"], panel["ylim"]
    return x0 + (step - xlo) / (xhi - xlo) * (x1 - x0), bottom - (value - ylo) / (yhi - ylo) * (bottom - top)


COLOUR_TOLERANCE = 0.1
NEAR = 2  # pixels


def coloured_near(image: Any, x: float, y: float, colour: str) -> bool:
    """Some pixel within NEAR pixels of (x, y) has ``colour`` (each channel within the tolerance)."""
    col, row = int(x), int(y)
    window = image[max(0, row - NEAR) : row + NEAR + 1, max(0, col - NEAR) : col + NEAR + 1]
    return bool((abs(window - rgb(colour)).max(axis=2) <= COLOUR_TOLERANCE).any())


def missing_points(image: Any, layout: dict[str, Any], data: Mapping[str, Sequence[tuple[int, float]]]) -> list[str]:
    """Each (step, value) of each series in ``data`` that the picture does not show: no pixel of the
    series' colour within 2 pixels of where the data puts it. Empty when the picture has every point."""
    missing = []
    drawn = {s["name"]: (panel, s["colour"]) for panel in layout["panels"] for s in panel["series"]}
    for name, points in data.items():
        assert name in drawn, f"no series {name!r} in the picture (it has {sorted(drawn)})"
        panel, colour = drawn[name]
        missing += [
            f"{name} at step {x} ({y})" for x, y in points if not coloured_near(image, *to_pixel(panel, x, y), colour)
        ]
    return missing


def dark(region: Any) -> Any:
    """Near-black pixels (text, frame and tick marks are black; no curve colour is that dark)."""
    return region.max(axis=2) < 0.35


def frame_gaps(image: Any, box: Sequence[float], samples: int = 25) -> list[str]:
    """Where along the four edges of ``box`` no near-black pixel is within a pixel: empty for a drawn frame."""
    x0, top, x1, bottom = box
    gaps = []
    for i in range(samples):
        f = (i + 0.5) / samples
        x, y = x0 + f * (x1 - x0), top + f * (bottom - top)
        for edge, (cx, cy) in {"left": (x0, y), "right": (x1, y), "top": (x, top), "bottom": (x, bottom)}.items():
            col, row = round(cx), round(cy)
            if not dark(image[row - 1 : row + 2, col - 1 : col + 2]).any():
                gaps.append(f"{edge} at ({col}, {row})")
    return gaps


def inked(image: Any, box: Sequence[float]) -> int:
    """Near-black pixels inside ``box`` (a text's extent)."""
    x0, top, x1, bottom = box
    return int(dark(image[int(top) : math.ceil(bottom), int(x0) : math.ceil(x1)]).sum())


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[Point]]:
    points = run_points()
    path = tmp_path_factory.mktemp("png") / "loss.png"
    layout = plot.png(points, path, title="qlora-demo")
    return path, layout, points


def test_the_png_carries_its_layout_and_it_is_the_one_returned(drawn: tuple[Path, dict[str, Any], list[Point]]) -> None:
    path, layout, _ = drawn
    assert json.loads(png_texts(path)[plot.LAYOUT_KEY]) == json.loads(json.dumps(layout))
    image = pixels(path)
    assert [image.shape[1], image.shape[0]] == layout["size"] == [900, 840]  # 9 x 8.4 inches at 100 dpi


def test_every_point_of_every_curve_is_in_the_png_in_its_colour(
    drawn: tuple[Path, dict[str, Any], list[Point]],
) -> None:
    path, layout, points = drawn
    image = pixels(path)
    data = {name: expected(points, field) for name, field in SERIES_FIELDS.items()}
    assert [len(v) for v in data.values()] == [TOTAL, TOTAL // EVAL_EVERY, TOTAL, TOTAL]
    assert missing_points(image, layout, data) == []
    # The pixels the layout reports are the ones the axes' box and limits give (within a pixel).
    for panel in layout["panels"]:
        for series in panel["series"]:
            assert series["data"] == [list(p) for p in data[series["name"]]]
            for (x, y), (px, py) in zip(series["data"], series["pixels"], strict=True):
                ex, ey = to_pixel(panel, x, y)
                assert abs(ex - px) <= 1, (series["name"], x, y)
                assert abs(ey - py) <= 1, (series["name"], x, y)
    # And it is not a picture of everything: the background is white, far from the curves.
    loss = layout["panels"][0]
    corner = to_pixel(loss, TOTAL * 0.9, max(v for _, v in data["loss"]))  # top right: the loss decayed long before
    assert (image[int(corner[1]), int(corner[0])] > 0.98).all()


def test_the_checker_finds_a_moved_point(drawn: tuple[Path, dict[str, Any], list[Point]], tmp_path: Path) -> None:
    """The PNG checked against data with one point moved, and a PNG of data with one point moved
    checked against the true data: either way the checker names the point."""
    path, layout, points = drawn
    image = pixels(path)
    losses = expected(points, "loss")
    moved = dict(losses)
    moved[50] += 0.8  # inside the axes (the loss starts near 2.4), far from the curve
    assert missing_points(image, layout, {"loss": sorted(moved.items())}) == [f"loss at step 50 ({moved[50]})"]

    wrong = [p if p.step != 50 or p.loss is None else Point(**{**p.__dict__, "loss": moved[50]}) for p in points]
    wrong_path = tmp_path / "wrong.png"
    wrong_layout = plot.png(wrong, wrong_path, title="qlora-demo")
    assert missing_points(pixels(wrong_path), wrong_layout, {"loss": losses}) == [
        f"loss at step 50 ({dict(losses)[50]})"
    ]


def test_the_png_has_its_frames_ticks_labels_legend_and_title(drawn: tuple[Path, dict[str, Any], list[Point]]) -> None:
    path, layout, _ = drawn
    image = pixels(path)
    assert layout["title"]["text"] == "qlora-demo"
    assert [p["name"] for p in layout["panels"]] == ["loss", "learning rate", "throughput"]
    assert [p["ylabel"]["text"] for p in layout["panels"]] == ["loss", "learning rate", "tokens/s"]
    assert [p["xlabel"] and p["xlabel"]["text"] for p in layout["panels"]] == [None, None, "step"]
    assert [[t["text"] for t in p["legend"]] for p in layout["panels"]] == [
        ["loss", "eval loss"],
        ["learning rate"],
        ["tokens/s"],
    ]
    for panel in layout["panels"]:
        assert [t["text"] for t in panel["xticks"]] == ["0", "20", "40", "60", "80", "100"], panel["name"]
        assert len(panel["yticks"]) >= 3, panel["name"]
        assert frame_gaps(image, panel["axes"]) == [], panel["name"]
        texts = [panel["ylabel"], *panel["xticks"], *panel["yticks"], *panel["legend"]]
        texts += [panel["xlabel"]] if panel["xlabel"] else []
        for label in texts:
            assert inked(image, label["box"]) >= 8, f"{panel['name']}: {label['text']!r} at {label['box']} is blank"
            x0, top, x1, bottom = label["box"]
            assert 0 <= x0 < x1 <= layout["size"][0], label  # not cut off
            assert 0 <= top < bottom <= layout["size"][1], label
    assert inked(image, layout["title"]["box"]) >= 20
    lr = layout["panels"][1]
    assert [t["text"] for t in lr["yticks"]] == ["0", "5.0e-05", "1.0e-04", "1.5e-04", "2.0e-04"]
    # The tick labels say where they are: each y label's middle is level with its value on the axis.
    for panel in layout["panels"]:
        for tick in panel["yticks"]:
            value = float(tick["text"])
            _, y = to_pixel(panel, 0, value)
            assert abs((tick["box"][1] + tick["box"][3]) / 2 - y) <= 2, (panel["name"], tick)


def test_the_frame_and_text_checks_can_fail(drawn: tuple[Path, dict[str, Any], list[Point]]) -> None:
    path, layout, _ = drawn
    image = pixels(path)
    x0, top, x1, bottom = layout["panels"][0]["axes"]
    middle = (x0 + x1) / 2
    assert len(frame_gaps(image, [middle, top, x1, bottom])) >= 20  # no frame down the middle of the axes
    assert inked(image, [middle - 20, top + 2, middle + 20, top + 12]) == 0  # an empty stretch of the loss panel


def test_png_without_matplotlib_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(plot.PlotError, match=re.escape("pip install 'kubedgx[plot]'")) as caught:
        plot.write(run_points(), tmp_path / "loss.png", title="t")
    assert ".html" in str(caught.value)
    assert not (tmp_path / "loss.png").exists()


# --- nothing to draw, and what is drawn ------------------------------------------------------------


@pytest.mark.parametrize("draw", ["text", "html", "svg", "png"])
def test_no_points_is_said_plainly(draw: str, tmp_path: Path) -> None:
    draws: dict[str, Callable[[], object]] = {
        "text": lambda: plot.text([]),
        "html": lambda: plot.html([], title="t"),
        "svg": lambda: plot.svg([], title="t"),
        "png": lambda: plot.png([], tmp_path / "x.png", title="t"),
    }
    with pytest.raises(plot.PlotError, match="no progress reported yet"):
        draws[draw]()
    with pytest.raises(plot.PlotError, match="no progress reported yet"):
        plot.text([Point(step=3, total_steps=10)])  # a point with no value to draw


def test_a_panel_without_values_is_left_out() -> None:
    points = [Point(step=s, total_steps=10, loss=2.0 - s / 10, samples_per_second=1.5 + s / 100) for s in range(1, 11)]
    assert [(p.name, p.ylabel, [s.name for s in p.series]) for p in plot.panels(points)] == [
        ("loss", "loss", ["loss"]),
        ("throughput", "samples/s", ["samples/s"]),
    ]
    chart = plot.text(points)
    assert "learning rate" not in chart
    assert "throughput: * samples/s" in chart


def test_write_chooses_by_suffix(tmp_path: Path) -> None:
    points = run_points()
    assert plot.write(points, tmp_path / "a.html", title="t").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    svg_file = plot.write(points, tmp_path / "b.svg", title="t")
    assert ET.fromstring(svg_file.read_text(encoding="utf-8")).tag == "{http://www.w3.org/2000/svg}svg"
    assert plot.write(points, tmp_path / "c.PNG", title="t").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(
        plot.PlotError,
        match=re.escape("x.jpg: cannot tell what to draw from its suffix; name a .png, .html, .svg file"),
    ):
        plot.write(points, tmp_path / "x.jpg", title="t")


# --- the text chart --------------------------------------------------------------------------------


def chart_block(chart: str, legend: str, height: int) -> tuple[list[str], str, str]:
    """The rows of the panel whose legend line is ``legend``: (plot rows, the axis line, the step line)."""
    lines = chart.splitlines()
    at = lines.index(legend)
    return lines[at + 1 : at + 1 + height], lines[at + 1 + height], lines[at + 2 + height]


def test_text_puts_the_extremes_on_the_top_and_bottom_rows() -> None:
    points = [Point(step=s, total_steps=40, loss=1.0 + (s - 25) ** 2 / 100, learning_rate=1e-4) for s in range(1, 41)]
    # The highest loss at step 1 (6.76), the lowest at step 25 (1.0).
    chart = plot.text(points, width=60, height=10)
    rows, axis, steps = chart_block(chart, "loss: * loss", 10)
    assert rows[0].startswith("6.760 |"), rows
    assert rows[-1].startswith("1.000 |"), rows
    plot_area = [r[len("6.760 |") :] for r in rows]
    cells = 60 - len("6.760 |")
    assert plot_area[0][0] == "*"  # step 1: the first column, top row
    column_25 = round((25 - 1) / (40 - 1) * (cells - 1))
    assert plot_area[-1][column_25] == "*"  # step 25: its column, bottom row
    assert all(r.startswith(" " * 6 + "|") for r in rows[1:-1]), rows  # min and max only are labelled
    assert all(set(a) <= {"*", " "} for a in plot_area)
    assert axis == " " * 6 + "+" + "-" * cells
    assert steps.split() == ["1", "step", "40"]
    assert len(steps) == 60
    # A constant series (the learning rate here) is drawn on one row, labelled with its value.
    lr_rows, _, _ = chart_block(chart, "learning rate: * learning rate", 10)
    assert [i for i, r in enumerate(lr_rows) if "*" in r] == [4]
    assert lr_rows[0].startswith("0.00011 |"), lr_rows
    assert lr_rows[-1].startswith("  9e-05 |"), lr_rows


def test_text_has_the_legend_header_and_keeps_to_the_width() -> None:
    points = run_points()
    for width in (40, 80, 120):
        chart = plot.text(points, width=width, height=8)
        lines = chart.splitlines()
        assert max(len(line) for line in lines) <= width, width
        assert all(c.isascii() for c in chart)
        assert "loss: * loss   o eval loss" in lines
        assert "throughput: * tokens/s" in lines
        assert any(line.startswith("learning rate:") for line in lines)
    chart = plot.text(points, width=120, height=8)
    assert chart.splitlines()[0].startswith("step 100/100  loss ")
    rows, _, _ = chart_block(chart, "loss: * loss   o eval loss", 8)
    assert sum(r.count("o") for r in rows) >= 4  # five evaluations, two may share a cell


# --- the HTML page and its SVG -------------------------------------------------------------------


def page_xml(page: str) -> ET.Element:
    doctype, _, rest = page.partition("\n")
    assert doctype == "<!DOCTYPE html>"
    return ET.fromstring(rest)


def numbers(text: str) -> list[float]:
    return [float(v) for v in text.split()]


def test_html_polylines_are_the_data_scaled_into_the_plot_area() -> None:
    points = run_points()
    root = page_xml(plot.html(points, title="qlora-demo <run & 1>"))
    assert root.findtext("head/title") == "qlora-demo <run & 1>"
    panels = root.findall("body/svg")
    assert [p.get("data-panel") for p in panels] == ["loss", "learning rate", "throughput"]
    seen = set()
    for panel in panels:
        area = panel.find("rect[@class='plot-area']")
        assert area is not None
        x, y, w, h = (float(area.get(k) or "nan") for k in ("x", "y", "width", "height"))
        xlo, xhi = numbers(panel.get("data-xlim") or "")
        ylo, yhi = numbers(panel.get("data-ylim") or "")
        assert xlo < 1
        assert xhi > TOTAL
        for line in panel.findall("polyline[@class='series']"):
            name = line.get("data-series") or ""
            seen.add(name)
            data = expected(points, SERIES_FIELDS[name])
            drawn = [tuple(map(float, pair.split(","))) for pair in (line.get("points") or "").split()]
            assert len(drawn) == len(data), name
            for (step, value), (px, py) in zip(data, drawn, strict=True):
                assert px == pytest.approx(x + (step - xlo) / (xhi - xlo) * w, abs=0.006), (name, step)
                assert py == pytest.approx(y + h - (value - ylo) / (yhi - ylo) * h, abs=0.006), (name, step)
                assert x <= px <= x + w
                assert y <= py <= y + h
        circles = panel.findall("circle[@class='marker']")
        assert len(circles) == (TOTAL // EVAL_EVERY if panel.get("data-panel") == "loss" else 0)
        titles = {t.text for t in panel.findall("text") if "axis-title" in (t.get("class") or "")}
        ylabel = {"loss": "loss", "learning rate": "learning rate", "throughput": "tokens/s"}[
            panel.get("data-panel") or ""
        ]
        assert titles == {"step", ylabel}
        assert [t.text for t in panel.findall("text[@class='tick-x']")] == ["0", "20", "40", "60", "80", "100"]
        assert len(panel.findall("text[@class='tick-y']")) >= 3
        assert panel.findall("g[@class='legend']")
    assert seen == set(SERIES_FIELDS)
    cells = [(row.findtext("th"), row.findtext("td")) for row in root.iter("tr")]
    assert cells[0] == ("step", "100/100")
    assert [name for name, _ in cells[1:]] == ["loss", "eval loss", "learning rate", "tokens/s"]


def test_html_and_svg_load_nothing_from_elsewhere() -> None:
    page = plot.html(run_points(), title="t")
    assert not re.search(r"https?://", page)
    assert not re.search(r"<script|<link|<img|@import|url\(|@font-face", page, re.IGNORECASE)
    image = plot.svg(run_points(), title="t")
    root = ET.fromstring(image)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"  # the namespace is a name, not a fetch
    assert re.findall(r"https?://[^\"]*", image) == ["http://www.w3.org/2000/svg"]
    assert len(root.findall("{http://www.w3.org/2000/svg}svg")) == 3


# --- kubedgx run --local's pictures --------------------------------------------------------------


def test_run_local_draws_the_loss_next_to_the_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = local.write_pictures(run_lines(), tmp_path, title="quickstart (kubedgx run --local)")
    assert written == [tmp_path / "loss.html", tmp_path / "loss.png"]
    root = page_xml((tmp_path / "loss.html").read_text(encoding="utf-8"))
    assert root.findtext("head/title") == "quickstart (kubedgx run --local)"
    layout = json.loads(png_texts(tmp_path / "loss.png")[plot.LAYOUT_KEY])
    assert missing_points(pixels(tmp_path / "loss.png"), layout, {"loss": expected(run_points(), "loss")}) == []

    # Without matplotlib, the page alone; without a progress line, nothing.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert local.write_pictures(run_lines(), tmp_path / "b", title="t") == [tmp_path / "b" / "loss.html"]
    assert local.write_pictures(["just output", '{"event": "start", "step": 0}'], tmp_path / "c", title="t") == []
    assert not (tmp_path / "c").exists()


def test_ticks_are_round_and_their_labels_tell_them_apart() -> None:
    assert plot.nice_ticks(-0.5, 3.5, 8, integer=True) == [0, 1, 2, 3]  # steps: never 2.5
    assert plot.nice_ticks(0.65, 2.45, 6) == [1.0, 1.5, 2.0]
    assert plot.tick_labels([4.5e-5, 4.75e-5, 5e-5, 5.25e-5]) == ["4.50e-05", "4.75e-05", "5.00e-05", "5.25e-05"]
    assert plot.tick_labels([0, 5e-5, 1e-4]) == ["0", "5.0e-05", "1.0e-04"]
    assert plot.tick_labels([1000, 1100, 1200]) == ["1000", "1100", "1200"]
    assert plot.tick_labels([0.5, 0.75, 1.0]) == ["0.50", "0.75", "1.00"]


def test_text_wraps_its_header_between_items() -> None:
    points = [
        Point(step=s, total_steps=150, loss=2.5 - s / 100, learning_rate=5e-5, samples_per_second=3.25)
        for s in (10, 20)
    ]
    header = plot.text(points, width=44).split("\n\n")[0].splitlines()
    assert header == ["step 20/150  loss 2.300  learning rate 5e-05", "samples/s 3.250"]

"""The Flyte Deck of a DGX task: one self-contained HTML page about its finished DGXTrainingJob.

What the page holds: how the job ended (its phase, and the reason and message of its Succeeded or
Failed condition), where and how it ran (instance, nodes, restarts, start, completion, duration),
what it used (GPU-hours, cost, spot savings, as ``status.usage`` says, docs/cost.md), what it made
(``status.artifacts`` with their URIs), the ``kubedgx`` commands that look further, and the loss
curve of the run's progress history, drawn by :mod:`dgx_operator.client.plot` (the chart that
``kubedgx plot <job> -o loss.html`` writes). Without history the page says so, and why.

Pure: the job (as the API server returns it) and the points in, the page out. The connector writes
it to ``<output prefix>/deck.html`` when the job has ended (:mod:`flytekitplugins.dgx.results`).
Well-formed XML after its doctype line, like ``plot.html``'s page: no script, no font, no style
sheet or image from elsewhere.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dgx_api.history import Point
from dgx_operator.api.vocabulary import JobCondition, JobPhase
from dgx_operator.client import plot
from dgx_operator.client.lines import describe_event, duration_text, parse_time

#: Why a page has no curve when the caller does not say: what gives a run its history.
NO_HISTORY: Final = (
    "the task reported no progress. A run reports progress by printing the progress contract's lines "
    "(dgx_api.progress.Reporter, docs/trainer.md), and only a direction: Out data mount keeps them once "
    "the pods are gone"
)

_STYLE: Final = """
table.summary th { font-weight: normal; color: #555555; white-space: nowrap; vertical-align: top; }
table.summary td, table.artifacts td { word-break: break-all; }
code, pre { font-family: monospace; }
pre { background: #f5f5f5; padding: 0.6em 0.8em; }
h2 { font-size: 1.1em; margin: 1.2em 0 0.4em 0; }
p.none { color: #555555; }
"""


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return {}


def ended(job: Mapping[str, Any]) -> tuple[str, str]:
    """(reason, message) of the condition that says how the job ended: Failed for a failed job,
    Succeeded otherwise, else Finished."""
    status = job.get("status") or {}
    failed = status.get("phase") == JobPhase.FAILED
    cond = _condition(status, JobCondition.FAILED if failed else JobCondition.SUCCEEDED) or _condition(
        status, JobCondition.FINISHED
    )
    return str(cond.get("reason") or ""), str(cond.get("message") or "")


def duration(status: Mapping[str, Any]) -> str:
    """startTime to completionTime, as ``kubedgx`` prints durations (``1h02m``); "-" without both."""
    start, end = parse_time(status.get("startTime")), parse_time(status.get("completionTime"))
    if start is None or end is None:
        return "-"
    return duration_text((end - start).total_seconds())


def summary(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The summary table's rows, (label, value), in order; a field the job lacks is left out."""
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    reason, message = ended(job)
    rows = [
        ("job", f"{meta.get('namespace') or '-'}/{meta.get('name') or '-'}"),
        ("phase", str(status.get("phase") or JobPhase.PENDING)),
    ]
    if reason:
        rows.append(("reason", reason))
    if message:
        rows.append(("message", message))
    rows.append(("instance", str(spec.get("instance") or "-")))
    rows.append(("nodes", str(status.get("nodes") or "-")))
    rows.append(("restarts", str(status.get("restarts") or 0)))
    for label, key in (("started", "startTime"), ("completed", "completionTime")):
        if status.get(key):
            rows.append((label, str(status[key])))
    rows.append(("duration", duration(status)))
    progress = status.get("progress") or {}
    if isinstance(progress, Mapping) and progress.get("step") is not None:
        rows.append(("last report", describe_event({"event": "progress", **progress})))
    usage = status.get("usage") or {}
    if usage:
        rows.append(("GPU-hours", str(usage.get("gpuHours") or "0.00")))
        currency = str(usage.get("currency") or "")
        if usage.get("cost") is not None:
            example = " (the catalog's example prices)" if usage.get("examplePrices") else ""
            rows.append(("cost", f"{usage['cost']} {currency}".strip() + example))
        if usage.get("spotSavings") is not None:
            rows.append(("spot savings", f"{usage['spotSavings']} {currency}".strip()))
        if usage.get("unpricedGpuSeconds"):
            rows.append(("unpriced GPU-seconds", str(usage["unpricedGpuSeconds"])))
    return rows


def commands(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(command, what it shows): the ``kubedgx`` verbs that look further into the job."""
    meta = job.get("metadata") or {}
    name, ns = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    where = f" -n {ns}" if ns else ""
    return [
        (f"kubedgx describe {name}{where}", "the job, its workers, mounts, artifacts and events"),
        (f"kubedgx logs {name}{where}", "what worker 0 printed, while its pod is there"),
        (f"kubedgx plot {name}{where} -o loss.html", "this loss curve, read again"),
    ]


def render(job: Mapping[str, Any], points: Sequence[Point], *, history_note: str | None = None) -> str:
    """The page. ``points``: the run's progress history (empty: the page says there is none, and
    why: ``history_note``, else :data:`NO_HISTORY`)."""
    esc = html.escape
    meta = job.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    status = job.get("status") or {}
    title = f"DGXTrainingJob {ns}/{name}: {status.get('phase') or JobPhase.PENDING}"
    rows = "\n".join(
        f'<tr><th scope="row">{esc(label)}</th><td>{esc(value)}</td></tr>' for label, value in summary(job)
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head>\n<meta charset="utf-8"/>',
        f"<title>{esc(title)}</title>",
        f"<style>{plot.STYLE}{_STYLE}</style>",
        "</head>\n<body>",
        f"<h1>{esc(title)}</h1>",
        f'<table class="summary">\n{rows}\n</table>',
    ]
    artifacts = [a for a in status.get("artifacts") or [] if isinstance(a, Mapping)]
    if artifacts:
        cells = "\n".join(
            f"<tr><td>{esc(str(a.get('name') or ''))}</td><td><code>{esc(str(a.get('uri') or ''))}</code></td>"
            f"<td>{esc(str(a.get('mount') or '-'))}</td></tr>"
            for a in artifacts
        )
        parts += [
            "<h2>Artifacts</h2>",
            f'<table class="artifacts">\n<tr><th>name</th><th>URI</th><th>mount</th></tr>\n{cells}\n</table>',
        ]
    parts.append("<h2>Loss curve</h2>")
    if points:
        try:
            parts.append(plot.figures(points))
        except plot.PlotError as exc:  # points without a figure to draw (steps only)
            parts.append(f'<p class="none">No loss curve: {esc(str(exc))}.</p>')
    else:
        parts.append(f'<p class="none">No loss curve: {esc(history_note or NO_HISTORY)}.</p>')
    lines = "\n".join(f"{esc(command)}   # {esc(why)}" for command, why in commands(job))
    parts += [
        "<h2>Look further</h2>",
        f"<pre>{lines}</pre>",
        '<p class="none">Written by the kubedgx connector when the job ended. A deck the task writes '
        "itself (<code>enable_deck=True</code>) takes its place.</p>",
        "</body>\n</html>\n",
    ]
    return "\n".join(parts)

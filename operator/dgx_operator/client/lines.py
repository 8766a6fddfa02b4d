"""The trainer's JSON progress lines as a person reads them, and the little arithmetic around them.

A worker's stdout mixes the trainer's contract lines (``{"event": "progress", ...}``, docs/trainer.md)
with whatever the libraries print. ``kubedgx logs`` shows the contract lines as one readable line
each and every other line as it is; ``--raw`` (and the Python client's ``LogLine.text``) keeps
the original. Pure: no cluster, no clock other than the one passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(float(value)) else None


def loss_text(value: Any) -> str:
    number = _num(value)
    return "-" if number is None else f"{number:.4f}"


def rate_text(value: Any) -> str:
    number = _num(value)
    if number is None:
        return "-"
    return f"{number:,.0f}" if number >= 100 else f"{number:.3g}"


def step_text(step: Any, total: Any) -> str:
    s, t = _num(step), _num(total)
    if s is None:
        return "-"
    if t is None or t <= 0:
        return f"{int(s)}"
    return f"{int(s)}/{int(t)}"


def duration_text(seconds: float | None) -> str:
    """``1h02m``, ``3m12s``, ``45s``: what a person wants from an ETA."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours >= 24:
        return f"{hours // 24}d{hours % 24:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def describe_event(event: Mapping[str, Any]) -> str:
    """One contract line, readable: ``step 40/100 (40%)  loss 1.2345  eval 1.3012 @40  lr 2.00e-04
    1,234 tok/s  epoch 0.40``. Fields the line lacks are left out, never shown as zero."""
    kind = str(event.get("event"))
    if kind == "start":
        mode = ", ".join(str(event[k]) for k in ("precision", "quantization") if event.get(k))
        where = f"step {event.get('step', 0)} of {event.get('totalSteps', '?')}"
        return f"training starts at {where}" + (f" ({mode})" if mode else "")
    if kind == "eval":
        return f"eval at step {event.get('step', '?')}: loss {loss_text(event.get('evalLoss'))}"
    if kind == "summary":
        status = event.get("status", "?")
        loss = event.get("trainLoss")
        return f"finished: {status}" + (f", mean train loss {loss_text(loss)}" if loss is not None else "")
    if kind != "progress":
        fields = " ".join(f"{k}={v}" for k, v in event.items() if k != "event" and not isinstance(v, dict | list))
        return f"{kind}: {fields}".rstrip(": ")
    parts = [f"step {step_text(event.get('step'), event.get('totalSteps'))}"]
    step, total = _num(event.get("step")), _num(event.get("totalSteps"))
    if step is not None and total:
        parts[0] += f" ({100 * step / total:.0f}%)"
    if event.get("loss") is not None:
        parts.append(f"loss {loss_text(event.get('loss'))}")
    if event.get("evalLoss") is not None:
        parts.append(f"eval {loss_text(event.get('evalLoss'))} @{event.get('evalStep', '?')}")
    if _num(event.get("learningRate")) is not None:
        parts.append(f"lr {float(event['learningRate']):.2e}")
    if _num(event.get("tokensPerSecond")) is not None:
        parts.append(f"{rate_text(event['tokensPerSecond'])} tok/s")
    elif _num(event.get("samplesPerSecond")) is not None:
        parts.append(f"{rate_text(event['samplesPerSecond'])} samples/s")
    if _num(event.get("gpuUtilization")) is not None:
        parts.append(f"GPU {float(event['gpuUtilization']):.0f}%")
    if _num(event.get("epoch")) is not None:
        parts.append(f"epoch {float(event['epoch']):.2f}")
    return "  ".join(parts)


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def eta_seconds(
    step: int | None, total: int | None, start: datetime | None, updated: datetime | None, first_step: int = 0
) -> float | None:
    """Seconds left at the pace of the current run: (updated - start) per (step - first_step) steps,
    times the steps left. None when there is no pace to go by yet (no step done in this run)."""
    if step is None or total is None or start is None or updated is None:
        return None
    if step >= total:
        return 0.0
    done = step - first_step
    elapsed = (updated - start).total_seconds()
    if done <= 0 or elapsed <= 0:
        return None
    return elapsed / done * (total - step)


def age_text(created: datetime | None, now: datetime) -> str:
    """kubectl's AGE column: ``45s``, ``12m``, ``3h``, ``2d``."""
    if created is None:
        return "-"
    seconds = max(0.0, (now - created).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


__all__ = [
    "age_text",
    "describe_event",
    "duration_text",
    "eta_seconds",
    "loss_text",
    "parse_time",
    "rate_text",
    "step_text",
]

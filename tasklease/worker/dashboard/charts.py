"""The dashboard's pictures: inline SVG drawn here, on the server, so a page needs no script
(and the page's Content-Security-Policy none: inline ``<svg>`` is markup, not an image).

Each function returns :class:`markupsafe.Markup`; every text in it is escaped here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from markupsafe import Markup, escape

from tasklease.protocol import rfc3339
from tasklease.worker.core.activity import STATES, Activity, HandlerActivity
from tasklease.worker.core.deliveries import OUTCOMES, DeliveryMinutes
from tasklease.worker.core.timeline import Bar, BarEnd, Timeline

COLOURS = {
    "completed": "#2f9e44",
    "skipped": "#adb5bd",
    "failed": "#c92a2a",
    "released": "#f08c00",
    "in_progress": "#1c7ed6",
    "stuck": "#862e9c",
    "lapsed": "#862e9c",
    "running": "#1c7ed6",
    "pending": "#adb5bd",
    "cancelled": "#495057",
}
LABELS = {
    "completed": "completed (processed)",
    "skipped": "skipped (overlap)",
    "failed": "failed (dead letter)",
    "released": "released (waiting for a retry)",
    "in_progress": "in progress",
    "stuck": "stuck (lease lapsed)",
}
OUTCOME_COLOURS = {
    "processed": "#2f9e44",
    "duplicate": "#74c0fc",
    "in_progress": "#1c7ed6",
    "released": "#f08c00",
    "failed": "#c92a2a",
    "lost_claim": "#862e9c",
    "other": "#868e96",
}
OUTCOME_LABELS = {
    "processed": "processed (ran, recorded)",
    "duplicate": "duplicate (answered from the record)",
    "in_progress": "in_progress (409: another attempt held it)",
    "released": "released (raised, retried)",
    "failed": "failed (dead letter)",
    "lost_claim": "lost_claim (fenced out)",
    "other": "other (key busy, unavailable, ...)",
}
# What a stacked chart stacks, bottom first, and each part's colour and label.
_Palette = tuple[Sequence[str], Mapping[str, str], Mapping[str, str]]
_RUNS: _Palette = (STATES, COLOURS, LABELS)
_OUTCOMES: _Palette = (OUTCOMES, OUTCOME_COLOURS, OUTCOME_LABELS)
_FONT = 'font-family="system-ui,sans-serif"'


def legend() -> list[tuple[str, str, str]]:
    """``(state, colour, label)`` for each state a chart stacks, bottom first."""
    return [(state, COLOURS[state], LABELS[state]) for state in STATES]


def responsive(wide: Markup, narrow: Markup) -> Markup:
    """Both drawings of one chart; the page's CSS shows the one for its width (an SVG's text
    scales with it, so one drawing cannot be legible on a phone and on a desktop)."""
    return Markup(  # noqa: S704 - both parts are Markup made here.
        f'<div class="wide-only">{wide}</div><div class="narrow-only">{narrow}</div>'
    )


def minutes_chart(
    activity: HandlerActivity,
    summary: Activity,
    *,
    title: str,
    width: int = 480,
    height: int = 150,
) -> Markup:
    """Runs by the minute of their latest claim, stacked by how they stand now, and a line of
    runs finished per minute; the minutes before a cut-short read are shaded as not read."""
    left, bottom, top = 30, 22, 10
    plot_w, plot_h = width - left - 6, height - bottom - top
    columns = len(activity.claimed) or 1
    step = plot_w / columns
    peak = activity.peak
    scale = plot_h / peak
    parts = [_svg_open(width, height, title, "chart")]
    parts.append(_gridlines(left, top, plot_w, plot_h, peak))
    if summary.truncated:
        cut = (summary.complete_since - summary.start) / (summary.now - summary.start)
        shade_w = min(max(cut, 0.0), 1.0) * plot_w
        parts.append(
            f'<rect x="{left}" y="{top}" width="{shade_w:.1f}" height="{plot_h}" '
            'fill="#e9ecef"><title>not read: the read stopped at its limit</title></rect>'
        )
    frame = (left, top, plot_h, step)
    parts.extend(_stacks(activity.claimed, _RUNS, "claimed", frame, scale))
    points = " ".join(
        f"{left + (i + 0.5) * step:.1f},{top + plot_h - n * scale:.1f}"
        for i, n in enumerate(activity.finished)
    )
    if any(activity.finished):
        parts.append(
            f'<polyline class="finished" points="{points}" fill="none" stroke="#17212b" '
            'stroke-width="1.5" stroke-dasharray="3 2" opacity="0.75">'
            "<title>runs finished per minute</title></polyline>"
        )
    parts.append(_hour_axis(left, top + plot_h + 15, plot_w))
    return Markup("".join(parts))  # noqa: S704 - each text in parts went through escape().


def deliveries_chart(
    minutes: DeliveryMinutes, *, title: str, width: int = 480, height: int = 150
) -> Markup:
    """Deliveries per minute, stacked by outcome, from the store's delivery tally."""
    left, bottom, top = 30, 22, 10
    plot_w, plot_h = width - left - 6, height - bottom - top
    scale = plot_h / minutes.peak
    parts = [_svg_open(width, height, title, "chart deliveries")]
    parts.append(_gridlines(left, top, plot_w, plot_h, minutes.peak))
    frame = (left, top, plot_h, plot_w / (len(minutes.columns) or 1))
    parts.extend(_stacks(minutes.columns, _OUTCOMES, "delivered", frame, scale))
    parts.append(_hour_axis(left, top + plot_h + 15, plot_w))
    return Markup("".join(parts))  # noqa: S704 - each text in parts went through escape().


def outcome_legend() -> list[tuple[str, str, str]]:
    """``(outcome, colour, label)`` for each outcome the deliveries chart stacks."""
    return [(o, OUTCOME_COLOURS[o], OUTCOME_LABELS[o]) for o in OUTCOMES]


def _stacks(
    columns: Sequence[Mapping[str, int]],
    palette: _Palette,
    verb: str,
    frame: tuple[float, float, float, float],
    scale: float,
) -> list[str]:
    """One stacked bar per column, the palette's order bottom first; ``frame`` is (left,
    top, plot height, a column's width)."""
    order, colours, labels = palette
    left, top, plot_h, step = frame
    parts = []
    for index, counts in enumerate(columns):
        y: float = top + plot_h
        x = left + index * step
        for state in order:
            count = counts.get(state, 0)
            if not count:
                continue
            h = count * scale
            y -= h
            tip = f"{count} {labels[state]}, {verb} {_minutes_ago(len(columns) - index)}"
            parts.append(
                f'<rect class="bar {state}" x="{x + 0.5:.1f}" y="{y:.1f}" '
                f'width="{max(step - 1, 1):.1f}" height="{h:.1f}" fill="{colours[state]}">'
                f"<title>{escape(tip)}</title></rect>"
            )
    return parts


def _hour_axis(left: float, axis_y: float, plot_w: float) -> str:
    """The time axis under an hour's chart, and the drawing's end."""
    parts = []
    for fraction, label in ((0, "60 min ago"), (0.5, "30 min"), (1, "now")):
        anchor = ("start", "middle", "end")[int(fraction * 2)]
        parts.append(_text(left + fraction * plot_w, axis_y, label, anchor, 12))
    return "".join(parts) + "</svg>"


def timeline_chart(line: Timeline, *, title: str, width: int = 640) -> Markup:
    """Each bar of ``line`` on one time axis: claim to finish (or release, or the lease's
    lapse), a live attempt's lease drawn on past now, earlier attempts as a stub."""
    compact = width < 600  # A phone's drawing: the role goes into the heading line.
    left, right, row = (36 if compact else 116), 12, 54
    plot_w = width - left - right
    height = row * len(line.bars) + 28
    parts = [_svg_open(width, height, title, "timeline")]
    parts.append(
        f'<defs><pattern id="unknown-{width}" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="3" height="6" fill="#ced4da"/></pattern>'
        "</defs>"
    )
    for index, item in enumerate(line.bars):
        parts.append(
            _attempt_row(
                line,
                item,
                index * row + 4,
                left=left,
                plot_w=plot_w,
                hatch=f"unknown-{width}",
                compact=compact,
            )
        )
    axis_y = height - 8
    parts.append(_text(left, axis_y, _clock(line.start), "start", 12))
    parts.append(_text(left + plot_w, axis_y, _clock(line.end), "end", 12))
    span = (line.end - line.start).total_seconds()
    parts.append(_text(left + plot_w / 2, axis_y, f"span {_duration(span)}", "middle", 12))
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - each text in parts went through escape().


def _attempt_row(
    line: Timeline,
    item: Bar,
    y: float,
    *,
    left: float,
    plot_w: float,
    hatch: str,
    compact: bool,
) -> str:
    x0 = left + line.position(item.start) * plot_w
    x1 = left + line.position(item.end) * plot_w
    colour = COLOURS.get(item.ends.value, "#495057")
    seconds = (item.end - item.start).total_seconds()
    heading = (
        f"attempt {item.attempt} · {item.attempt_id[:18]} · fencing token {item.fencing_token}"
        if item.ends is not BarEnd.PENDING
        else "no attempt yet"
    )
    if item.role != "this run":
        heading = f"run {item.run_id[:28]} · {heading}"
    if compact:
        heading = f"{item.role} · {heading}"
    parts = [_text(4 if compact else left, y + 12, heading, "start", 12, fill="#5b6670")]
    if not compact:
        parts.append(_text(4, y + 30, item.role, "start", 12, weight="600"))
    if item.earlier:
        parts.append(
            f'<rect class="earlier" x="{left - 30}" y="{y + 18}" width="26" height="18" '
            f'fill="url(#{hatch})" stroke="#adb5bd"><title>{item.earlier} earlier '
            "attempt(s): times not kept</title></rect>"
        )
        parts.append(_text(left - 17, y + 31, f"+{item.earlier}", "middle", 11, weight="600"))
    if item.lease_until is not None and item.lease_until > item.end:
        lx = left + line.position(item.lease_until) * plot_w
        parts.append(
            f'<rect class="lease" x="{x1:.1f}" y="{y + 18}" width="{max(lx - x1, 1):.1f}" '
            f'height="18" fill="none" stroke="{colour}" stroke-dasharray="4 3">'
            f"<title>lease until {escape(rfc3339(item.lease_until, 'seconds'))}</title></rect>"
        )
    tip = f"{item.ends.value}: {rfc3339(item.start)} to {rfc3339(item.end)}"
    parts.append(
        f'<rect class="attempt {item.ends.value}" x="{x0:.1f}" y="{y + 18}" '
        f'width="{max(x1 - x0, 3):.1f}" height="18" rx="3" fill="{colour}">'
        f"<title>{escape(tip)}</title></rect>"
    )
    ending = {
        BarEnd.RUNNING: "running, lease live",
        BarEnd.LAPSED: "lease lapsed",
        BarEnd.RELEASED: "released by an operator" if item.by_operator else "released",
    }.get(item.ends, item.ends.value)
    label = f"{ending} · {_duration(seconds)}" if item.ends is not BarEnd.PENDING else ending
    anchor_x, anchor = (x1 + 4, "start") if x1 < left + plot_w * 0.6 else (x1 - 4, "end")
    fill = "#17212b" if anchor == "start" else "#fff"
    if anchor == "end" and x1 - x0 < 140:
        anchor_x, anchor, fill = x0 - 4, "end", "#17212b"
        if x0 - left < 140:
            anchor_x, anchor, fill = left + plot_w, "end", "#17212b"
    parts.append(_text(anchor_x, y + 31, label, anchor, 12, fill=fill, weight="600"))
    return "".join(parts)


def _svg_open(width: int, height: int, title: str, kind: str) -> str:
    return (
        f'<svg class="{kind}" viewBox="0 0 {width} {height}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg" preserveAspectRatio="xMinYMin meet">'
        f"<title>{escape(title)}</title>"
    )


def _gridlines(left: float, top: float, plot_w: float, plot_h: float, peak: int) -> str:
    parts = []
    for value in _ticks(peak):
        y = top + plot_h - value / peak * plot_h
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#e9ecef" stroke-width="1"/>'
        )
        parts.append(_text(left - 4, y + 4, str(value), "end", 11, fill="#5b6670"))
    parts.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" '
        'stroke="#adb5bd" stroke-width="1"/>'
    )
    return "".join(parts)


def _ticks(peak: int) -> Iterable[int]:
    """Up to three round gridline values up to ``peak``."""
    step = max(1, -(-peak // 3))
    return range(step, peak + 1, step)


def _text(
    x: float,
    y: float,
    text: str,
    anchor: str,
    size: int,
    *,
    fill: str = "#1d232a",
    weight: str = "400",
) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
        f'font-weight="{weight}" fill="{fill}" {_FONT}>{escape(text)}</text>'
    )


def _minutes_ago(minutes: int) -> str:
    return "in the last minute" if minutes <= 1 else f"{minutes - 1}-{minutes} min ago"


def _clock(moment: datetime) -> str:
    return moment.strftime("%H:%M:%S")


def _duration(seconds: float) -> str:
    """``0.42 s``, ``12 s``, ``3 min 4 s``, ``2 h 5 min``."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def seconds_text(seconds: float | None) -> str:
    """A percentile for a table cell: ``—`` when there is none."""
    return "—" if seconds is None else _duration(seconds)

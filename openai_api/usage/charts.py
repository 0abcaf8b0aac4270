"""The usage page's charts, pure: the time bucket a range is drawn in, its buckets, the series
of the top groups (the rest summed as "other") and the inline SVG of a line chart. No
database, no JavaScript: the admin's usage page (openai_api/usage/admin_page.py) draws them
on the server, as the dashboard's lines are (polylines in an SVG)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.utils.html import format_html, format_html_join

from openai_api.usage.held import BUCKETS, bucket_of

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from datetime import datetime, timedelta

    from django.utils.safestring import SafeString

# Points a chart draws at most: the smallest bucket that keeps a range under it is chosen.
MAX_POINTS = 400
TOP = 8  # series drawn one by one; the rest are summed as one
# A colour per series, the rest's last (grey).
COLOURS = (
    "#0d6efd",
    "#dc3545",
    "#198754",
    "#fd7e14",
    "#6f42c1",
    "#20c997",
    "#d63384",
    "#795548",
)
OTHER_COLOUR = "#8c959f"
WIDTH, HEIGHT = 800, 200
COUNTS = ("tokens", "requests", "errors")
TIME_FORMATS = {"minute": "%m-%d %H:%M", "hour": "%m-%d %H:00", "day": "%Y-%m-%d"}


@dataclass(frozen=True)
class Series:
    name: str
    values: tuple[float, ...]
    colour: str
    other: bool = False  # the groups past the top, summed

    @property
    def total(self) -> float:
        return sum(self.values)


def bucket_for(span: timedelta) -> str:
    """The shortest of minute, hour and day that draws `span` in at most MAX_POINTS points."""
    for name, length in BUCKETS.items():
        if span / length <= MAX_POINTS:
            return name
    return "day"


def bucket_starts(since: datetime, until: datetime, bucket: str) -> list[datetime]:
    """The start of each UTC bucket from the one `since` falls in to the last before `until`."""
    step = BUCKETS[bucket]
    starts = []
    moment = bucket_of(since, bucket)
    while moment < until:
        starts.append(moment)
        moment += step
    return starts


def top_series(
    points: Iterable[tuple[str, datetime, float]], starts: Sequence[datetime], top: int = TOP
) -> list[Series]:
    """A series per name from (name, bucket start, value) points, a value per start (0 where
    none): the `top` with the largest totals, largest first (then by name), and the others
    summed as one last series, "other (N more)". Names that total 0 are left out."""
    place = {start: n for n, start in enumerate(starts)}
    sums: dict[str, list[float]] = {}
    for name, start, value in points:
        if start in place and value:
            sums.setdefault(name, [0.0] * len(starts))[place[start]] += value
    ranked = sorted(
        ((name, values) for name, values in sums.items() if sum(values)),
        key=lambda item: (-sum(item[1]), item[0]),
    )
    shown = [
        Series(name, tuple(values), COLOURS[n % len(COLOURS)])
        for n, (name, values) in enumerate(ranked[:top])
    ]
    rest = ranked[top:]
    if rest:
        summed = tuple(sum(column) for column in zip(*(v for _, v in rest), strict=True))
        shown.append(Series(f"other ({len(rest)} more)", summed, OTHER_COLOUR, other=True))
    return shown


def figure(value: float, unit: str) -> str:
    """A value as the page writes it: counts whole, seconds to a tenth (under 10: to a
    thousandth), thousands separated."""
    if unit in COUNTS:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:.3f}".rstrip("0").rstrip(".")


def polyline_points(values: Sequence[float], top: float) -> str:
    """The SVG points of values scaled to 0..`top` (the chart's height) across its width; a
    single value is drawn flat across."""
    if len(values) == 1:
        values = (values[0], values[0])
    step = WIDTH / (len(values) - 1)
    scale = HEIGHT / top if top else 0.0
    return " ".join(f"{n * step:.1f},{HEIGHT - v * scale:.1f}" for n, v in enumerate(values))


def line_chart(
    series: Sequence[Series], starts: Sequence[datetime], bucket: str, unit: str
) -> SafeString:
    """A line chart (inline SVG) of the series over the buckets, scaled to the largest value,
    with the times at its ends and middle under it and a legend naming each series with its
    total (every name escaped)."""
    if not series or not starts:
        return format_html('<p class="ms-none">No {} in this range.</p>', unit)
    top = max(max(s.values) for s in series)
    lines = format_html_join(
        "",
        '<polyline data-series="{}" stroke="{}" points="{}"><title>{}: {}</title></polyline>',
        (
            (s.name, s.colour, polyline_points(s.values, top), s.name, figure(s.total, unit))
            for s in series
        ),
    )
    svg = format_html(
        '<svg class="ms-chart ms-usage-chart" viewBox="0 0 {} {}" preserveAspectRatio="none"'
        ' role="img" aria-label="{} per {}">{}</svg>',
        WIDTH,
        HEIGHT,
        unit,
        bucket,
        lines,
    )
    shown = TIME_FORMATS[bucket]
    middle = starts[len(starts) // 2]
    axis = format_html(
        '<div class="ms-axis"><span>{}</span><span>{}</span><span>{} UTC</span></div>',
        starts[0].strftime(shown),
        middle.strftime(shown),
        starts[-1].strftime(shown),
    )
    legend = format_html_join(
        "",
        '<li data-series="{}"><span class="ms-swatch" style="background: {}"></span>{}'
        ' <span class="ms-sub">{} {}</span></li>',
        ((s.name, s.colour, s.name, figure(s.total, unit), unit) for s in series),
    )
    return format_html(
        '<div class="ms-chart-box"><div class="ms-scale">max {} {} per {}</div>{}{}'
        '<ul class="ms-legend">{}</ul></div>',
        figure(top, unit),
        unit,
        bucket,
        svg,
        axis,
        legend,
    )


def level_of(percent: float, warn_percent: float) -> str:
    """A budget's level: over at 100% or past it, warn at `warn_percent` or past it, else ok."""
    return "over" if percent >= 100 else "warn" if percent >= warn_percent else "ok"


def percent_bar(percent: float, warn_percent: float) -> SafeString:
    """A budget's bar: filled to its percent (at most full), its level (level_of) as a class."""
    level = level_of(percent, warn_percent)
    width = f"{min(max(percent, 0.0), 100.0):.1f}"
    return format_html(
        '<div class="ms-bar ms-budget-bar" role="img" aria-label="{}% used">'
        '<div class="ms-seg ms-level-{}" style="width: {}%"></div></div>',
        f"{percent:.0f}",
        level,
        width,
    )

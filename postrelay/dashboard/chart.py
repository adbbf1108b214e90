"""The overview's chart, drawn on the server: done and failed jobs per minute as stacked
bars in an SVG. Pure geometry here; templates/_chart.html turns it into markup (escaped
like every other value, styled by classes from the CSS file — no inline styles, which the
Content-Security-Policy would refuse)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

WIDTH, HEIGHT = 720, 170
LEFT, RIGHT, TOP, BOTTOM = 40, 8, 10, 22  # room for the axis labels


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    done_y: float
    done_h: float
    failed_y: float
    failed_h: float
    label: str  # the tooltip


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    grid: list[tuple[float, str]]  # (y, label) of the horizontal grid lines
    ticks: list[tuple[float, str]]  # (x, label) under the bars
    total_done: int
    total_failed: int
    peak: int
    plot_left: int
    plot_right: int
    baseline: float


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 × 10^n that is at least `value`, and at least 5 so that an
    idle hour still has a readable scale."""
    value = max(value, 5)
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= value:
                return step * scale
        scale *= 10


def per_minute(series: list[tuple[datetime, int, int]]) -> Chart:
    """Bars for (minute, done, failed) tuples, oldest first."""
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    baseline = float(TOP + plot_h)
    peak = max((d + f for _, d, f in series), default=0)
    top = nice_ceiling(peak)
    slot = plot_w / max(len(series), 1)
    gap = min(2.0, slot * 0.2)
    bars = []
    for i, (minute, done, failed) in enumerate(series):
        done_h = plot_h * done / top
        failed_h = plot_h * failed / top
        label = f"{minute:%H:%M} UTC — {done:,} done, {failed:,} failed"
        bars.append(Bar(round(LEFT + i * slot + gap / 2, 2), round(slot - gap, 2),
                        round(baseline - done_h, 2), round(done_h, 2),
                        round(baseline - done_h - failed_h, 2), round(failed_h, 2), label))
    grid = [(round(baseline - plot_h * f, 2), f"{int(top * f):,}") for f in (0, 0.5, 1)]
    n = len(series)
    ticks = [(round(LEFT + (n - 1 - ago) * slot + slot / 2, 2), f"−{ago} min" if ago else "now")
             for ago in reversed(range(0, n, 15))]
    return Chart(WIDTH, HEIGHT, bars, grid, ticks, sum(d for _, d, _ in series),
                 sum(f for _, _, f in series), peak, LEFT, WIDTH - RIGHT, baseline)

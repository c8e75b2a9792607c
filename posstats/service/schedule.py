"""Scheduling logic for ``posstats schedule`` (pure: no processes, clock injected).

Two kinds of schedule:

* :class:`Interval` (``--every 6h``; units s, m, h, d, w, combinable: ``1h30m``; at least
  1 s): ticks at ``start, start + every, start + 2 every, ...``, the first one at once.
* :class:`Cron` (``--cron "0 */6 * * *"``): the five classic fields minute, hour,
  day of month, month, day of week, each ``*``, ``N``, ``A-B``, ``*/S``, ``A-B/S``, ``N/S``
  or a comma list of those; month names ``jan..dec`` and day names ``sun..sat``
  (0 and 7 are Sunday); macros ``@hourly @daily @midnight @weekly @monthly @yearly
  @annually``. As in Vixie cron, when both day fields are restricted (neither starts with
  ``*``) a day matches if *either* does; otherwise both must match. The first tick is the first matching minute after the start.
  The fields are read in UTC, or in the wall-clock time of an IANA time zone
  (``parse_cron(text, tz="Europe/Paris")``). Across daylight-saving changes: a wall-clock
  time that is skipped (spring forward) fires at the same offset as before the change,
  i.e. just after the jump (``30 2 * * *`` runs at 03:30 that day); one that occurs twice
  (fall back) fires once, at its first occurrence.

Ticks are absolute instants (aware datetimes); run ids name them in UTC.

:func:`run_schedule` is the loop: it waits for a tick, runs one pipeline run (a callable),
and only then looks for the next tick. Runs therefore never overlap; ticks that passed
while a run was running are skipped (counted and reported), not queued.
"""

from __future__ import annotations

import calendar
import datetime as _dt
import re
import time
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posstats.errors import OptionError, PosstatsError

__all__ = [
    "Cron",
    "Interval",
    "ScheduleStats",
    "parse_cron",
    "parse_interval",
    "parse_schedule",
    "run_schedule",
    "tick_run_id",
    "time_zone",
]

UTC = _dt.timezone.utc
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_MONTHS = {name: i for i, name in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                               "nov", "dec"), start=1)}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, _MONTHS),
           ("day of week", 0, 7, _DAYS))
MAX_SEARCH_YEARS = 8  # a cron expression that never fires within this is refused (e.g. 30 Feb)


def _utc(t: _dt.datetime) -> _dt.datetime:
    if t.tzinfo is None:
        msg = "schedule times must be timezone-aware"
        raise ValueError(msg)
    return t.astimezone(UTC)


@dataclass(frozen=True)
class Interval:
    """Ticks every ``seconds`` seconds from a start time (the first tick is the start)."""

    seconds: float
    text: str = ""

    def first(self, start: _dt.datetime, /) -> _dt.datetime:
        return _utc(start)

    def next_after(self, tick: _dt.datetime, after: _dt.datetime, /) -> _dt.datetime:
        """The first tick ``tick + k * seconds`` (k >= 1) strictly after ``after``."""
        tick, after = _utc(tick), _utc(after)
        step = _dt.timedelta(seconds=self.seconds)
        k = max(1, int((after - tick) / step) + 1)
        nxt = tick + k * step
        while nxt <= after:
            nxt += step
        return nxt

    def describe(self) -> str:
        return f"every {self.text or f'{self.seconds:g}s'}"


def time_zone(name: str, /) -> _dt.tzinfo:
    """The IANA time zone ``name`` ("UTC" needs no time zone database).

    Raises:
        PosstatsError: an unknown name, naming it.
    """
    if name in ("UTC", "Etc/UTC", "Z"):
        return UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        msg = f"unknown time zone {name!r}: use an IANA name such as UTC, Europe/Paris or America/New_York ({exc})"
        raise PosstatsError(msg) from None


@dataclass(frozen=True)
class Cron:
    """A 5-field cron expression read in the wall-clock time of ``tz`` (an IANA name);
    sets of allowed values per field."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday (7 folded into 0)
    day_restricted: bool
    weekday_restricted: bool
    text: str = field(default="", compare=False)
    tz: str = "UTC"

    @property
    def zone(self) -> _dt.tzinfo:
        return time_zone(self.tz)

    def matches_day(self, d: _dt.date, /) -> bool:
        """Whether the day fields (and month) allow date ``d``."""
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.day_restricted and self.weekday_restricted:
            return dom or dow
        return dom and dow

    def matches(self, t: _dt.datetime, /) -> bool:
        """Whether minute ``t`` (any aware time; read in ``tz``) is a tick."""
        t = _utc(t).astimezone(self.zone)
        return t.minute in self.minutes and t.hour in self.hours and self.matches_day(t.date())

    def first(self, start: _dt.datetime, /) -> _dt.datetime:
        return self.next_after(start, start)

    def next_after(self, tick: _dt.datetime, after: _dt.datetime, /) -> _dt.datetime:
        """The first tick strictly after ``after`` (``tick`` is not used), in UTC.

        Searches wall-clock minutes of ``tz`` (naive, so no minute is counted twice or
        missed), makes each candidate aware with ``fold=0`` (PEP 495: a skipped time takes
        the offset before the change, a repeated one its first occurrence) and keeps the
        first that is later than ``after``.
        """
        after = _utc(after)
        zone = self.zone
        t = after.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0) + _dt.timedelta(minutes=1)
        limit = t + _dt.timedelta(days=366 * MAX_SEARCH_YEARS)
        while t < limit:
            t = self._next_wall_minute(t, limit)
            if t >= limit:
                break
            tick_utc = t.replace(tzinfo=zone).astimezone(UTC)
            if tick_utc > after:
                return tick_utc
            t += _dt.timedelta(minutes=1)  # a repeated hour's second pass, or a skipped time
        msg = f"cron expression {self.text!r} never fires"
        raise PosstatsError(msg)

    def _next_wall_minute(self, t: _dt.datetime, limit: _dt.datetime, /) -> _dt.datetime:
        """The first matching naive wall-clock minute at or after ``t`` (``limit`` if none)."""
        hours, minutes = sorted(self.hours), sorted(self.minutes)
        while t < limit:
            if not self.matches_day(t.date()):
                t = _dt.datetime(t.year, t.month, t.day) + _dt.timedelta(days=1)
                continue
            h = next((x for x in hours if x >= t.hour), None)
            if h is None:
                t = _dt.datetime(t.year, t.month, t.day) + _dt.timedelta(days=1)
                continue
            if h > t.hour:
                t = t.replace(hour=h, minute=0)
            m = next((x for x in minutes if x >= t.minute), None)
            if m is None:
                t = t.replace(minute=0) + _dt.timedelta(hours=1)
                continue
            return t.replace(minute=m)
        return limit

    def describe(self) -> str:
        return f"cron {self.text!r} ({self.tz})"


def parse_interval(text: Any, /) -> Interval:
    """``"6h"``, ``"30m"``, ``"1h30m"``, ``"90s"``, ``"2d"``, ``"1w"`` (>= 1 s).

    Raises:
        PosstatsError: anything else.
    """
    if not isinstance(text, str) or not re.fullmatch(r"\s*(\d+(\.\d+)?\s*[smhdw]\s*)+", text):
        msg = f"invalid interval {text!r}: use a number with a unit s, m, h, d or w (e.g. 6h, 30m, 1h30m)"
        raise PosstatsError(msg)
    seconds = sum(float(n) * _UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)\s*([smhdw])", text))
    if seconds < 1:
        msg = f"invalid interval {text!r}: must be at least 1 s"
        raise PosstatsError(msg)
    return Interval(seconds, text.strip())


def _parse_field(text: str, name: str, lo: int, hi: int, names: dict[str, int]) -> tuple[frozenset[int], bool]:
    def value(tok: str) -> int:
        tok_l = tok.lower()
        if tok_l in names:
            return names[tok_l]
        if not tok.isdigit():
            msg = f"{name}: {tok!r} is not a number" + (f" or a name ({', '.join(names)})" if names else "")
            raise PosstatsError(msg)
        v = int(tok)
        if not lo <= v <= hi:
            msg = f"{name}: {v} is outside {lo}-{hi}"
            raise PosstatsError(msg)
        return v

    out: set[int] = set()
    for part in text.split(","):
        if not part:
            msg = f"{name}: empty list item in {text!r}"
            raise PosstatsError(msg)
        rng, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                msg = f"{name}: bad step {step_text!r}"
                raise PosstatsError(msg)
            step = int(step_text)
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            x, _, y = rng.partition("-")
            a, b = value(x), value(y)
            if a > b:
                msg = f"{name}: range {rng!r} runs backwards"
                raise PosstatsError(msg)
        else:
            a = value(rng)
            b = hi if step_text else a
        out.update(range(a, b + 1, step))
    return frozenset(out), not text.startswith("*")


def parse_cron(text: Any, /, *, tz: str = "UTC") -> Cron:
    """Parse a 5-field cron expression or a macro (see the module docstring), read in the
    wall-clock time of ``tz`` (an IANA time zone name).

    Raises:
        PosstatsError: a malformed expression (naming the field), one that never fires, or
            an unknown time zone.
    """
    time_zone(tz)
    if not isinstance(text, str):
        msg = f"invalid cron expression {text!r}"
        raise PosstatsError(msg)
    expr = _MACROS.get(text.strip().lower(), text.strip())
    parts = expr.split()
    if len(parts) != 5:
        msg = f"invalid cron expression {text!r}: need 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}"
        raise PosstatsError(msg)
    sets = []
    restricted = []
    for part, (name, lo, hi, names) in zip(parts, _FIELDS, strict=True):
        try:
            values, r = _parse_field(part, name, lo, hi, names)
        except PosstatsError as exc:
            raise PosstatsError(f"invalid cron expression {text!r}: {exc}") from None
        sets.append(values)
        restricted.append(r)
    weekdays = frozenset(d % 7 for d in sets[4])
    cron = Cron(sets[0], sets[1], sets[2], sets[3], weekdays, restricted[2], restricted[4], text.strip(), tz)
    if not any(d <= calendar.monthrange(2000, m)[1] for m in cron.months for d in cron.days) and not (
            cron.day_restricted and cron.weekday_restricted):
        msg = f"invalid cron expression {text!r}: day of month never occurs in the months given"
        raise PosstatsError(msg)
    return cron


def parse_schedule(*, every: str | None = None, cron: str | None = None, tz: str = "UTC") -> Interval | Cron:
    """Exactly one of ``every`` / ``cron``; ``tz`` is the time zone of a cron expression."""
    if bool(every) == bool(cron):
        raise OptionError("give exactly one of {every} INTERVAL or {cron} EXPRESSION")
    time_zone(tz)
    return parse_interval(every) if every else parse_cron(cron, tz=tz)


def tick_run_id(tick: _dt.datetime, /, *, prefix: str = "sched") -> str:
    """The run id of a scheduled tick: ``sched-YYYYMMDDTHHMMSSZ`` (UTC)."""
    return f"{prefix}-{_utc(tick).strftime('%Y%m%dT%H%M%SZ')}"


@dataclass
class ScheduleStats:
    """What :func:`run_schedule` did."""

    runs: int = 0
    succeeded: int = 0
    failed: int = 0
    skipped_ticks: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)


def run_schedule(
    schedule: Interval | Cron,
    run_once: Callable[[_dt.datetime], bool],
    /,
    *,
    runs: int | None = None,
    now: Callable[[], _dt.datetime] = lambda: _dt.datetime.now(UTC),
    sleep: Callable[[float], None] | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> ScheduleStats:
    """Run ``run_once(tick)`` at every tick of ``schedule``, one run at a time.

    Args:
        schedule: an :class:`Interval` or :class:`Cron`.
        run_once: runs the pipeline for a tick; returns whether it succeeded.
        runs: stop after this many runs (None: forever).
        now, sleep: the clock (injectable for tests).
        log: receives one line per event.

    Returns:
        :class:`ScheduleStats` (runs, successes, failures, ticks skipped while running).
    """

    sleep = sleep or time.sleep
    stats = ScheduleStats()
    tick = schedule.first(now())
    log(f"schedule {schedule.describe()}: first run at {tick.isoformat()}")
    while runs is None or stats.runs < runs:
        while True:
            wait = (tick - now()).total_seconds()
            if wait <= 0:
                break
            sleep(min(wait, 60.0))
        started = now()
        ok = bool(run_once(tick))
        ended = now()
        stats.runs += 1
        stats.succeeded += ok
        stats.failed += not ok
        stats.results.append({"tick": tick.isoformat(), "started": started.isoformat(), "ended": ended.isoformat(),
                              "ok": ok})
        if runs is not None and stats.runs >= runs:
            break
        nxt = schedule.next_after(tick, tick)
        skipped = 0
        while nxt <= ended:
            skipped += 1
            nxt = schedule.next_after(tick, nxt)
        if skipped:
            stats.skipped_ticks += skipped
            log(f"skipped {skipped} tick(s) that came while the run was running (runs never overlap)")
        tick = nxt
    return stats

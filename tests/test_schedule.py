"""posstats.service.schedule: intervals, cron expressions (against a brute-force day-by-day oracle),
and the run loop with an injected clock (no overlap, skipped ticks, --runs)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.errors import PosstatsError
from posstats.service.pipeline_store import validate_run_id
from posstats.service.schedule import (
    Cron,
    Interval,
    parse_cron,
    parse_interval,
    parse_schedule,
    run_schedule,
    tick_run_id,
)

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, 5, 59, 30, tzinfo=UTC)  # a Monday


# ----------------------------------------------------------------------------- intervals


@pytest.mark.parametrize(("text", "seconds"), [("6h", 21600), ("30m", 1800), ("1h30m", 5400), ("90s", 90), ("1d", 86400),
                                               ("1w", 604800), ("1.5h", 5400), (" 2m 10s ", 130)])
def test_intervals(text, seconds):
    assert parse_interval(text).seconds == seconds


@pytest.mark.parametrize("text", ["", "6", "h", "6x", "-1h", "0s", "0.5s", "soon", None, 5])
def test_bad_intervals(text):
    with pytest.raises(PosstatsError, match="invalid interval"):
        parse_interval(text)


def test_interval_ticks_are_anchored_at_the_start():
    iv = parse_interval("10m")
    assert iv.first(T0) == T0
    assert iv.next_after(T0, T0) == T0 + dt.timedelta(minutes=10)
    # after a 25-minute run, the next tick is the one at +30 min
    assert iv.next_after(T0, T0 + dt.timedelta(minutes=25)) == T0 + dt.timedelta(minutes=30)
    assert iv.next_after(T0, T0 + dt.timedelta(minutes=30)) == T0 + dt.timedelta(minutes=40)


# ----------------------------------------------------------------------------- cron


def test_cron_examples():
    c = parse_cron("0 */6 * * *")
    assert c.next_after(T0, T0) == dt.datetime(2024, 1, 1, 6, 0, tzinfo=UTC)
    assert c.next_after(T0, dt.datetime(2024, 1, 1, 6, 0, tzinfo=UTC)) == dt.datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
    assert c.next_after(T0, dt.datetime(2024, 1, 1, 23, 0, tzinfo=UTC)) == dt.datetime(2024, 1, 2, 0, 0, tzinfo=UTC)
    assert parse_cron("30 2 29 2 *").first(T0) == dt.datetime(2024, 2, 29, 2, 30, tzinfo=UTC)
    assert parse_cron("@daily") == parse_cron("0 0 * * *")
    assert parse_cron("@weekly").first(T0) == dt.datetime(2024, 1, 7, 0, 0, tzinfo=UTC)  # Sunday
    assert parse_cron("0 9 * jan,Jul mon-fri").first(T0) == dt.datetime(2024, 1, 1, 9, 0, tzinfo=UTC)
    assert parse_cron("0 0 * * 7") == parse_cron("0 0 * * sun")
    assert parse_cron("5-10/2 * * * *").minutes == frozenset({5, 7, 9})
    assert parse_cron("50/5 * * * *").minutes == frozenset({50, 55})


def test_cron_day_of_month_or_day_of_week_when_both_are_restricted():
    c = parse_cron("0 0 13 * fri")  # the 13th or any Friday (Vixie cron)
    assert c.first(T0) == dt.datetime(2024, 1, 5, 0, 0, tzinfo=UTC)  # Friday 5 Jan
    ticks, t = [], T0
    for _ in range(5):
        t = c.next_after(t, t)
        ticks.append(t.date())
    assert dt.date(2024, 1, 13) in ticks  # a Saturday, but the 13th
    # a field starting with * leaves the other one alone (AND)
    assert parse_cron("0 0 */2 * sat").first(T0) == dt.datetime(2024, 1, 13, 0, 0, tzinfo=UTC)  # odd-day Saturday


@pytest.mark.parametrize(
    ("text", "message"),
    [("* * * *", "need 5 fields"), ("61 * * * *", "minute: 61 is outside 0-59"), ("* 24 * * *", "hour: 24"),
     ("* * 0 * *", "day of month: 0"), ("* * * 13 *", "month: 13"), ("* * * * 8", "day of week: 8"),
     ("*/0 * * * *", "bad step"), ("5-1 * * * *", "runs backwards"), ("* * * foo *", "'foo' is not a number"),
     ("1,,2 * * * *", "empty list item"), ("0 0 30 2 *", "never occurs"), ("0 0 31 4,6,9,11 *", "never occurs"),
     (None, "invalid cron")],
)
def test_bad_cron_expressions_name_the_field(text, message):
    with pytest.raises(PosstatsError, match=message):
        parse_cron(text)


def _oracle(cron: Cron, after: dt.datetime) -> dt.datetime:
    """Brute force: walk day by day, then minute by minute inside a matching day."""
    day = after.date()
    for _ in range(366 * 9):
        if cron.matches_day(day):
            start = dt.datetime(day.year, day.month, day.day, tzinfo=UTC)
            for m in range(1440):
                t = start + dt.timedelta(minutes=m)
                if t > after and t.hour in cron.hours and t.minute in cron.minutes:
                    return t
        day += dt.timedelta(days=1)
    raise AssertionError("no tick")


def _field(lo, hi):
    single = st.integers(lo, hi).map(str)
    rng = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(lambda ab: f"{min(ab)}-{max(ab)}")
    step = st.tuples(st.sampled_from(["*", f"{lo}-{hi}"]), st.integers(1, hi - lo + 1)).map(lambda p: f"{p[0]}/{p[1]}")
    item = st.one_of(single, rng, step)
    return st.one_of(st.just("*"), st.lists(item, min_size=1, max_size=3).map(",".join))


cron_texts = st.tuples(_field(0, 59), _field(0, 23), _field(1, 28), _field(1, 12), _field(0, 6)).map(" ".join)
times = st.datetimes(min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2090, 1, 1)).map(
    lambda t: t.replace(tzinfo=UTC))


@given(cron_texts, times)
@settings(max_examples=150, deadline=None)
def test_cron_next_equals_the_brute_force_oracle(text, after):
    cron = parse_cron(text)
    got = cron.next_after(after, after)
    assert got == _oracle(cron, after)
    assert got > after and cron.matches(got) and got.second == 0


def test_schedule_needs_exactly_one_kind():
    with pytest.raises(PosstatsError, match="exactly one"):
        parse_schedule()
    with pytest.raises(PosstatsError, match="exactly one"):
        parse_schedule(every="1h", cron="@daily")
    assert isinstance(parse_schedule(every="1h"), Interval) and isinstance(parse_schedule(cron="@daily"), Cron)


def test_tick_run_ids_are_valid_and_distinct():
    a = tick_run_id(T0)
    assert a == "sched-20240101T055930Z" and validate_run_id(a) == a
    assert tick_run_id(T0 + dt.timedelta(seconds=1)) != a
    with pytest.raises(ValueError, match="timezone-aware"):
        tick_run_id(dt.datetime(2024, 1, 1))


# ----------------------------------------------------------------------------- run loop


class FakeClock:
    def __init__(self, start: dt.datetime) -> None:
        self.t = start
        self.slept = 0.0

    def now(self) -> dt.datetime:
        return self.t

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.slept += seconds
        self.t += dt.timedelta(seconds=seconds)


@given(st.lists(st.floats(0.0, 3000.0), min_size=1, max_size=12), st.sampled_from(["10m", "1h", "45s"]))
@settings(max_examples=100, deadline=None)
def test_runs_never_overlap_and_missed_ticks_are_skipped(durations, every):
    clock = FakeClock(T0)
    sched = parse_interval(every)
    spans = []

    def run_once(tick):
        assert clock.now() >= tick  # never early
        start = clock.now()
        clock.t += dt.timedelta(seconds=durations[len(spans)])
        spans.append((tick, start, clock.now()))
        return len(spans) % 3 != 0

    stats = run_schedule(sched, run_once, runs=len(durations), now=clock.now, sleep=clock.sleep)
    assert stats.runs == len(durations) == len(spans)
    assert stats.failed == len(durations) // 3 and stats.succeeded + stats.failed == stats.runs
    for (_, _, end), (tick, start, _) in zip(spans, spans[1:]):
        assert start >= end  # no overlap
        assert tick > end or tick == start  # a tick that came during the run is never run late
    expected_skips = 0
    for (tick, _, end) in spans[:-1]:
        nxt = tick + dt.timedelta(seconds=sched.seconds)
        while nxt <= end:
            expected_skips += 1
            nxt += dt.timedelta(seconds=sched.seconds)
    assert stats.skipped_ticks == expected_skips
    ticks = [s[0] for s in spans]
    assert all(((t - T0).total_seconds() / sched.seconds).is_integer() for t in ticks)


def test_cron_loop_waits_for_each_tick():
    clock = FakeClock(T0)
    seen = []
    stats = run_schedule(parse_cron("*/15 * * * *"), lambda tick: seen.append((tick, clock.now())) or True, runs=3,
                         now=clock.now, sleep=clock.sleep)
    assert [t for t, _ in seen] == [dt.datetime(2024, 1, 1, 6, m, tzinfo=UTC) for m in (0, 15, 30)]
    assert all(now == tick for tick, now in seen) and stats.succeeded == 3 and stats.skipped_ticks == 0


# ----------------------------------------------------------------------------- time zones

PARIS = "Europe/Paris"


def _utc(*args):
    return dt.datetime(*args, tzinfo=UTC)


def test_cron_in_a_time_zone_follows_its_wall_clock():
    cron = parse_cron("0 9 * * *", tz=PARIS)
    assert cron.next_after(T0, _utc(2024, 1, 15, 0, 0)) == _utc(2024, 1, 15, 8, 0)  # CET, UTC+1
    assert cron.next_after(T0, _utc(2024, 7, 15, 0, 0)) == _utc(2024, 7, 15, 7, 0)  # CEST, UTC+2
    assert cron.describe() == "cron '0 9 * * *' (Europe/Paris)"
    assert cron.matches(_utc(2024, 7, 15, 7, 0)) and not cron.matches(_utc(2024, 7, 15, 9, 0))


def test_cron_across_daylight_saving_changes():
    cron = parse_cron("30 2 * * *", tz=PARIS)
    # 2024-03-31: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist: it fires at 03:30 CEST.
    assert cron.next_after(T0, _utc(2024, 3, 30, 12, 0)) == _utc(2024, 3, 31, 1, 30)
    # 2024-10-27: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice: it fires once.
    first = cron.next_after(T0, _utc(2024, 10, 26, 12, 0))
    assert first == _utc(2024, 10, 27, 0, 30)  # 02:30 CEST
    assert cron.next_after(first, first) == _utc(2024, 10, 28, 1, 30)  # next day, 02:30 CET
    # every 30 minutes through the jump: no tick twice, none lost after it
    every = parse_cron("*/30 * * * *", tz=PARIS)
    ticks, t = [], _utc(2024, 3, 31, 0, 0)
    for _ in range(4):
        t = every.next_after(t, t)
        ticks.append(t)
    assert ticks == [_utc(2024, 3, 31, 0, 30), _utc(2024, 3, 31, 1, 0), _utc(2024, 3, 31, 1, 30), _utc(2024, 3, 31, 2, 0)]


@pytest.mark.parametrize("tz", ["Nowhere/City", "", "Europe/../etc"])
def test_unknown_time_zone_is_refused(tz):
    with pytest.raises(PosstatsError, match="unknown time zone"):
        parse_cron("@daily", tz=tz)
    with pytest.raises(PosstatsError, match="unknown time zone"):
        parse_schedule(cron="@daily", tz=tz)


tz_names = st.sampled_from(["UTC", PARIS, "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"])
daily_crons = st.tuples(_field(0, 59), _field(0, 23)).map(lambda mh: f"{mh[0]} {mh[1]} * * *")


# Daylight-saving changes of 2024 (UTC) in those zones; times are drawn around them too.
_CHANGES = [_utc(2024, 3, 31, 1), _utc(2024, 10, 27, 1), _utc(2024, 3, 10, 7), _utc(2024, 11, 3, 6),
            _utc(2024, 4, 6, 15), _utc(2024, 10, 5, 15, 30)]
near_changes = st.tuples(st.sampled_from(_CHANGES), st.integers(-1500, 1500)).map(lambda p: p[0] + dt.timedelta(minutes=p[1]))


@given(daily_crons, st.one_of(times, near_changes), tz_names)
@settings(max_examples=200, deadline=None)
def test_cron_in_time_zones_against_minute_by_minute_oracle(text, after, tz):
    # No wall-clock match (first occurrence) is skipped between `after` and the tick, and the
    # tick is a match or a skipped wall-clock time taken at the offset before the change.
    cron = parse_cron(text, tz=tz)
    got = cron.next_after(after, after)
    assert got > after and got.second == 0 and got.tzinfo == UTC
    zone = cron.zone
    m = after.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    while m < got:
        assert not (cron.matches(m) and m.astimezone(zone).fold == 0), m
        m += dt.timedelta(minutes=1)
    if not cron.matches(got):  # a skipped wall-clock time: at fold=0 it maps onto got
        wall = got.astimezone(zone).replace(tzinfo=None)
        skipped = [wall - dt.timedelta(minutes=k) for k in range(1, 121)]
        assert any(
            w.replace(tzinfo=zone).astimezone(UTC) == got and w.minute in cron.minutes and w.hour in cron.hours
            for w in skipped
        ), (text, tz, got)

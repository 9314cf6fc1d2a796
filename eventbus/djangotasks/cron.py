"""A cron expression's ticks: the five fields (minute, hour, day of the month, month, day of the
week) as Celery's crontab parses them, their times in a time zone, as UTC instants.

What a field takes is what `celery.schedules.crontab` takes: `*`, numbers, ranges (`1-5`), lists
(`1,15`), steps (`*/15`, `0-30/10`), month names (`jan`) and day names (`mon`); the day of the week
runs from 0 (Sunday) to 6. When both day fields are restricted (neither starts with `*`), a day
matching either runs, as cron runs it (`0 9 1 * mon`: the 1st of each month, and every Monday).

Only the parsing is Celery's: its crontab finds a next run from the Celery app's time zone and
clock (`remaining_delta`), where a schedule needs any tick before or after any instant, in
settings.TIME_ZONE, and cron's day rule above. The walk over the calendar is this module's:

- A local time that does not exist (skipped when the clocks go forward) is shifted forward by
  the gap (02:30 on a day that jumps from 02:00 to 03:00 ticks at 03:30).
- A local time that comes twice (the clocks go back) ticks once, at its first occurrence; but an
  expression that runs every hour (hour field `*`) ticks in both copies of the repeated hour, as
  cron runs such jobs by the real time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo

# The Gregorian calendar repeats every 400 years: an expression with no tick in that span has none.
SEARCH_YEARS = 400
ONE_DAY = timedelta(days=1)


class InvalidCron(ValueError):
    """An expression that is not five valid fields, or that never ticks."""


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression (see the module doc); `Cron.parse("0 3 * * *")`."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday
    day_or_weekday: bool  # both day fields restricted: a day matching either ticks

    @classmethod
    def parse(cls, expression: str) -> Cron:
        """The expression's fields, parsed by Celery's crontab (note its argument order, not
        cron's: minute, hour, day_of_week, day_of_month, month_of_year).

        Raises
        ------
        InvalidCron
            For anything but five valid fields, or an expression that never ticks (`0 0 30 2 *`).
        """
        from celery.schedules import ParseException, crontab

        if not isinstance(expression, str):
            raise InvalidCron(f"a cron expression is a string, not {type(expression).__name__}")
        fields = expression.split()
        if len(fields) != 5:
            raise InvalidCron(
                f"{expression!r} is not a cron expression of 5 fields (minute hour day-of-month month day-of-week)"
            )
        minute, hour, day, month, weekday = fields
        try:
            parsed = crontab(
                minute=minute, hour=hour, day_of_week=weekday, day_of_month=day, month_of_year=month
            )
        except (ValueError, TypeError, KeyError, IndexError, ParseException) as exc:
            raise InvalidCron(f"{expression!r} is not a valid cron expression: {exc}") from None
        cron = cls(
            expression=" ".join(fields),
            minutes=tuple(sorted(parsed.minute)),
            hours=tuple(sorted(parsed.hour)),
            days=frozenset(parsed.day_of_month),
            months=frozenset(parsed.month_of_year),
            weekdays=frozenset(parsed.day_of_week),
            day_or_weekday=not day.startswith("*") and not weekday.startswith("*"),
        )
        if cron.next_after(datetime(2000, 1, 1, tzinfo=UTC), UTC) is None:
            raise InvalidCron(f"{expression!r} never ticks (no such day in {SEARCH_YEARS} years)")
        return cron

    def next_after(self, moment: datetime, tz: tzinfo) -> datetime | None:
        """The first tick strictly after `moment` (aware), in UTC; None if there is none."""
        local_day = moment.astimezone(tz).date()
        # From the day before: a time shifted forward out of a gap may fall on the next day.
        for day in self._days(local_day - ONE_DAY, forward=True):
            later = [t for d in (day, day + ONE_DAY) for t in self._instants(d, tz) if t > moment]
            if later:
                return min(later)
        return None

    def latest_at(self, moment: datetime, tz: tzinfo) -> datetime | None:
        """The last tick at or before `moment` (aware), in UTC; None if there is none."""
        local_day = moment.astimezone(tz).date()
        for day in self._days(local_day, forward=False):
            # The day before too: its times shifted forward out of a gap may come after this day's.
            earlier = [t for d in (day - ONE_DAY, day) for t in self._instants(d, tz) if t <= moment]
            if earlier:
                return max(earlier)
        return None

    # The calendar --------------------------------------------------------------------------

    def _matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_day, by_weekday = day.day in self.days, day.isoweekday() % 7 in self.weekdays
        return (by_day or by_weekday) if self.day_or_weekday else (by_day and by_weekday)

    def _days(self, start: date, *, forward: bool) -> Iterator[date]:
        """The days that tick, from `start` on (or back), within SEARCH_YEARS; whole months
        that do not tick are stepped over at once."""
        day = start
        try:
            while abs(day.year - start.year) <= SEARCH_YEARS:
                if day.month not in self.months:
                    if forward:
                        day = date(day.year + day.month // 12, day.month % 12 + 1, 1)
                    else:
                        day = date(day.year, day.month, 1) - ONE_DAY
                    continue
                if self._matches(day):
                    yield day
                day = day + ONE_DAY if forward else day - ONE_DAY
        except (OverflowError, ValueError):  # past date.min or date.max
            return

    def _instants(self, day: date, tz: tzinfo) -> list[datetime]:
        """The ticks of a local day that ticks, as UTC instants (see the module doc for the
        days the clocks change)."""
        if not self._matches(day):
            return []
        every_hour = len(self.hours) == 24
        instants = set()
        for hour in self.hours:
            for minute in self.minutes:
                local = datetime.combine(day, time(hour, minute), tzinfo=tz)
                instants.add(local.astimezone(UTC))
                if every_hour:
                    second = local.replace(fold=1)
                    # Its second occurrence, when the time comes twice (not a skipped time).
                    if second.astimezone(UTC).astimezone(tz).replace(tzinfo=None, fold=0) == local.replace(
                        tzinfo=None
                    ):
                        instants.add(second.astimezone(UTC))
        return sorted(instants)

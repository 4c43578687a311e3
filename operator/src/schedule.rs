//! Cron schedules for re-running a staging on a timer: `spec.schedule`
//! together with `spec.timeZone`.
//!
//! The grammar is the one a Kubernetes CronJob accepts (the robfig/cron
//! standard parser), so that users can copy a schedule between a CronJob and
//! a staging unchanged: five fields `minute hour day-of-month month
//! day-of-week`, the `@hourly`-style macros, and in addition an optional
//! leading seconds field, which tests use to fire every few seconds.
//!
//! This module only answers "when is the next run after this instant?". It
//! keeps no state and knows nothing about missed runs, concurrency or
//! deadlines; the reconciler decides what to do with the instant returned by
//! [`Schedule::next_after`].
//!
//! Fields are matched against civil (wall-clock) time in the schedule's time
//! zone, which makes daylight saving time a matter of choice:
//!
//! * A civil time that does not exist because the clocks jump forward runs at
//!   the first instant after the gap (a daily `30 2 * * *` in New York runs at
//!   03:00 on the day of the jump). All matches inside one gap collapse into
//!   that single instant, which fires once. robfig/cron, and so Kubernetes,
//!   silently skips such runs instead; for a staging, losing a day's data is
//!   worse than running half an hour late.
//! * A civil time that occurs twice because the clocks fall back fires once,
//!   at its first occurrence, so a staging never runs twice for one schedule
//!   slot (robfig/cron runs a matching repeated hour twice).

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp};

/// How many years past the start of a search [`Schedule::next_after`] looks
/// before it concludes that a schedule never fires.
///
/// It must exceed 8: that is the longest wait between two February 29ths
/// (2096 to 2104, as 2100 is no leap year), and `0 0 29 2 *` has to find it.
/// An impossible schedule such as `0 0 30 2 *` costs at most this many years
/// of day-by-day steps through its months, a few thousand cheap iterations.
pub const MAX_YEARS_AHEAD: i16 = 10;

/// Why a schedule or its time zone was refused.
///
/// Every message names the schedule and the offending field and says what is
/// allowed, because it is shown to the user who wrote the resource.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScheduleError {
    /// The schedule is empty or only whitespace.
    #[error(
        "schedule is empty: write five fields (minute hour day-of-month month day-of-week), \
         e.g. '0 3 * * *', or a macro such as @daily"
    )]
    Empty,
    /// The schedule starts with a `CRON_TZ=` or `TZ=` prefix.
    #[error("schedule '{expr}': '{prefix}' is not allowed in the schedule; set spec.timeZone instead")]
    TimeZonePrefix {
        /// The schedule as written.
        expr: String,
        /// The prefix, e.g. `TZ=Europe/Berlin`.
        prefix: String,
    },
    /// An `@` macro that is not supported, such as `@every`.
    #[error(
        "schedule '{expr}': unknown macro '{name}'; use @yearly, @annually, @monthly, \
         @weekly, @daily, @midnight or @hourly"
    )]
    UnknownMacro {
        /// The schedule as written.
        expr: String,
        /// The macro as written.
        name: String,
    },
    /// A macro followed by further fields.
    #[error("schedule '{expr}': {name} must stand alone; remove the fields after it")]
    MacroWithFields {
        /// The schedule as written.
        expr: String,
        /// The macro as written.
        name: String,
    },
    /// Neither 5 fields nor 6.
    #[error(
        "schedule '{expr}': expected 5 fields (minute hour day-of-month month day-of-week) \
         or 6 with a leading seconds field, found {found}"
    )]
    FieldCount {
        /// The schedule as written.
        expr: String,
        /// How many whitespace-separated fields there were.
        found: usize,
    },
    /// A comma list with an empty entry, e.g. `1,,2`.
    #[error(
        "schedule '{expr}': {field} has an empty entry; separate values with single commas, \
         e.g. 1,15,30"
    )]
    EmptyEntry {
        /// The schedule as written.
        expr: String,
        /// The field, e.g. `minute`.
        field: &'static str,
    },
    /// Something that is neither a number nor a name the field knows.
    #[error("schedule '{expr}': {field} '{value}' is not valid; use {allowed}")]
    InvalidValue {
        /// The schedule as written.
        expr: String,
        /// The field, e.g. `minute`.
        field: &'static str,
        /// The offending entry.
        value: String,
        /// What the field accepts.
        allowed: &'static str,
    },
    /// A number outside the field's range.
    #[error("schedule '{expr}': {field} {value} is out of range {min}-{max}")]
    OutOfRange {
        /// The schedule as written.
        expr: String,
        /// The field, e.g. `minute`.
        field: &'static str,
        /// The number as written.
        value: String,
        /// The smallest value the field accepts.
        min: u8,
        /// The largest value the field accepts.
        max: u8,
    },
    /// A range `a-b` with `a > b`.
    #[error(
        "schedule '{expr}': {field} range '{range}' runs backwards; the start must not be \
         greater than the end (split a wrap-around into two ranges, e.g. 22-23,0-2)"
    )]
    BackwardRange {
        /// The schedule as written.
        expr: String,
        /// The field, e.g. `hour`.
        field: &'static str,
        /// The range as written.
        range: String,
    },
    /// A step after `/` that is not a whole number of at least 1.
    #[error(
        "schedule '{expr}': {field} step '{step}' is not valid; use a whole number of at \
         least 1, e.g. */5"
    )]
    InvalidStep {
        /// The schedule as written.
        expr: String,
        /// The field, e.g. `minute`.
        field: &'static str,
        /// The step as written.
        step: String,
    },
    /// `?` outside day-of-month and day-of-week.
    #[error("schedule '{expr}': '?' is only allowed in day-of-month and day-of-week, not in {field}")]
    QuestionMark {
        /// The schedule as written.
        expr: String,
        /// The field, e.g. `hour`.
        field: &'static str,
    },
    /// `spec.timeZone` is not a known IANA time zone.
    #[error("unknown time zone '{0}': use an IANA name such as Europe/Berlin or UTC")]
    UnknownTimeZone(String),
}

/// A parsed cron schedule together with the time zone it is evaluated in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    // Bit `n` set means value `n` matches.
    seconds: u64,
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    // Sunday is bit 0 only; a written 7 is folded onto it.
    days_of_week: u64,
    // Cron's day rule: when both day fields are restricted a day matches if
    // either does, otherwise both must (the `*` one always does).
    either_day: bool,
    tz: TimeZone,
}

impl Schedule {
    /// Parses `expr` in time zone `time_zone` (IANA name; None = UTC).
    ///
    /// `expr` has 5 fields (`minute hour day-of-month month day-of-week`),
    /// 6 with a leading seconds field, or is one of `@yearly`, `@annually`,
    /// `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`.
    pub fn parse(expr: &str, time_zone: Option<&str>) -> Result<Schedule, ScheduleError> {
        let expr = expr.trim();
        let [sec, min, hour, dom, month, dow] = split_fields(expr)?;
        let field = |text, spec| parse_field(text, spec, expr);
        let dom = field(dom, &DAY_OF_MONTH)?;
        let dow = field(dow, &DAY_OF_WEEK)?;
        Ok(Schedule {
            seconds: field(sec, &SECOND)?.bits,
            minutes: field(min, &MINUTE)?.bits,
            hours: field(hour, &HOUR)?.bits,
            days_of_month: dom.bits,
            months: field(month, &MONTH)?.bits,
            days_of_week: fold_sunday(dow.bits),
            either_day: !dom.star && !dow.star,
            tz: parse_time_zone(time_zone)?,
        })
    }

    /// The first fire time strictly after `after`.  None only if no time ever
    /// matches (e.g. "0 0 30 2 *").
    ///
    /// Also None when nothing matches within [`MAX_YEARS_AHEAD`] years or
    /// before the end of the representable range (year 9999).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let start = next_whole_second(after)?;
        let mut from = self.tz.to_datetime(start);
        let last_year = from.year().saturating_add(MAX_YEARS_AHEAD);
        loop {
            let civil = self.next_civil_match(from, last_year)?;
            let fire = self.fire_instant(civil)?;
            if fire > after {
                return Some(fire);
            }
            // Only reachable when `after` lies in the second pass of a fold:
            // the first occurrences of the repeated civil times are already
            // past. A fold is usually an hour long, so stepping through it
            // one match at a time stays cheap (well under a millisecond even
            // for every-second schedules).
            from = civil.checked_add(SignedDuration::from_secs(1)).ok()?;
        }
    }

    /// The earliest civil time at or after `from` that matches every field,
    /// found by skipping whole months and days rather than single seconds.
    fn next_civil_match(&self, mut from: DateTime, last_year: i16) -> Option<DateTime> {
        loop {
            if from.year() > last_year {
                return None;
            }
            let month = from.month() as u8;
            match first_at_or_after(self.months, month) {
                Some(next) if next == month => {}
                Some(next) => {
                    from = midnight(Date::new(from.year(), next as i8, 1).ok()?);
                    continue;
                }
                None => {
                    from = midnight(Date::new(from.year().checked_add(1)?, 1, 1).ok()?);
                    continue;
                }
            }
            if self.day_matches(from.date())
                && let Some(time) = self.next_time_of_day(from.time())
            {
                return Some(DateTime::from_parts(from.date(), time));
            }
            from = midnight(from.date().tomorrow().ok()?);
        }
    }

    /// Applies cron's day-of-month / day-of-week rule to `date`.
    fn day_matches(&self, date: Date) -> bool {
        let dom = has(self.days_of_month, date.day() as u8);
        let dow = has(self.days_of_week, date.weekday().to_sunday_zero_offset() as u8);
        if self.either_day { dom || dow } else { dom && dow }
    }

    /// The earliest matching time of day at or after `from`, if any is left
    /// on this day.
    fn next_time_of_day(&self, from: Time) -> Option<Time> {
        let (h0, m0, s0) = (from.hour() as u8, from.minute() as u8, from.second() as u8);
        for hour in bits_from(self.hours, h0) {
            let min_from = if hour == h0 { m0 } else { 0 };
            for minute in bits_from(self.minutes, min_from) {
                let sec_from = if hour == h0 && minute == m0 { s0 } else { 0 };
                if let Some(second) = first_at_or_after(self.seconds, sec_from) {
                    return Time::new(hour as i8, minute as i8, second as i8, 0).ok();
                }
            }
        }
        None
    }

    /// The instant at which the matching civil time `civil` fires, applying
    /// the daylight saving rules from the module documentation.
    fn fire_instant(&self, civil: DateTime) -> Option<Timestamp> {
        match self.tz.to_ambiguous_timestamp(civil).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(civil).ok(),
            AmbiguousOffset::Fold { before, .. } => before.to_timestamp(civil).ok(),
            AmbiguousOffset::Gap { after, .. } => {
                // Read with the later offset, a civil time in the gap lands
                // before the transition; the next transition ends the gap.
                let before_gap = after.to_timestamp(civil).ok()?;
                match self.tz.following(before_gap).next() {
                    Some(transition) => Some(transition.timestamp()),
                    None => self.tz.to_ambiguous_timestamp(civil).compatible().ok(),
                }
            }
        }
    }
}

/// The accepted shape of one cron field.
struct FieldSpec {
    name: &'static str,
    min: u8,
    max: u8,
    /// Three-letter names, in order, for the values starting at `min_named`.
    names: &'static [&'static str],
    min_named: u8,
    /// How to describe valid values in an error message.
    allowed: &'static str,
    question_mark: bool,
}

const SECOND: FieldSpec = FieldSpec {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
    min_named: 0,
    allowed: "a number 0-59",
    question_mark: false,
};
const MINUTE: FieldSpec = FieldSpec { name: "minute", ..SECOND };
const HOUR: FieldSpec = FieldSpec { name: "hour", max: 23, allowed: "a number 0-23", ..SECOND };
const DAY_OF_MONTH: FieldSpec =
    FieldSpec { name: "day-of-month", min: 1, max: 31, allowed: "a number 1-31", question_mark: true, ..SECOND };
const MONTH: FieldSpec = FieldSpec {
    name: "month",
    min: 1,
    max: 12,
    names: &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
    min_named: 1,
    allowed: "a number 1-12 or a name JAN-DEC",
    question_mark: false,
};
const DAY_OF_WEEK: FieldSpec = FieldSpec {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
    min_named: 0,
    allowed: "a number 0-7 (0 and 7 are Sunday) or a name SUN-SAT",
    question_mark: true,
};

/// The values one field matches.
#[derive(Default)]
struct FieldSet {
    bits: u64,
    /// Whether the field is unrestricted (`*`, `?` or `*/1`), which decides
    /// the day rule; like robfig/cron, `*/2` counts as a restriction.
    star: bool,
}

/// Splits `expr` into seconds, minute, hour, day-of-month, month and
/// day-of-week, expanding macros and defaulting seconds to 0.
fn split_fields(expr: &str) -> Result<[&str; 6], ScheduleError> {
    let tokens: Vec<&str> = expr.split_whitespace().collect();
    let Some(first) = tokens.first() else {
        return Err(ScheduleError::Empty);
    };
    if first.starts_with('@') {
        let fields = macro_fields(first)
            .ok_or_else(|| ScheduleError::UnknownMacro { expr: expr.to_string(), name: first.to_string() })?;
        if tokens.len() > 1 {
            return Err(ScheduleError::MacroWithFields { expr: expr.to_string(), name: first.to_string() });
        }
        return Ok(fields);
    }
    let upper = first.to_ascii_uppercase();
    if upper.starts_with("CRON_TZ=") || upper.starts_with("TZ=") {
        return Err(ScheduleError::TimeZonePrefix { expr: expr.to_string(), prefix: first.to_string() });
    }
    match tokens[..] {
        [min, hour, dom, month, dow] => Ok(["0", min, hour, dom, month, dow]),
        [sec, min, hour, dom, month, dow] => Ok([sec, min, hour, dom, month, dow]),
        _ => Err(ScheduleError::FieldCount { expr: expr.to_string(), found: tokens.len() }),
    }
}

/// The six fields a macro stands for, or None if it is not one.
fn macro_fields(name: &str) -> Option<[&'static str; 6]> {
    Some(match name.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => ["0", "0", "0", "1", "1", "*"],
        "@monthly" => ["0", "0", "0", "1", "*", "*"],
        "@weekly" => ["0", "0", "0", "*", "*", "0"],
        "@daily" | "@midnight" => ["0", "0", "0", "*", "*", "*"],
        "@hourly" => ["0", "0", "*", "*", "*", "*"],
        _ => return None,
    })
}

/// Parses one field: a comma list of `*`, `?`, values, ranges and steps.
fn parse_field(text: &str, spec: &FieldSpec, expr: &str) -> Result<FieldSet, ScheduleError> {
    let mut set = FieldSet::default();
    for entry in text.split(',') {
        if entry.is_empty() {
            return Err(ScheduleError::EmptyEntry { expr: expr.to_string(), field: spec.name });
        }
        let (bits, star) = parse_entry(entry, spec, expr)?;
        set.bits |= bits;
        set.star |= star;
    }
    Ok(set)
}

/// Parses one list entry: `*`, `?`, `a`, `a-b`, optionally followed by `/n`.
fn parse_entry(entry: &str, spec: &FieldSpec, expr: &str) -> Result<(u64, bool), ScheduleError> {
    let (base, step) = match entry.split_once('/') {
        Some((base, step)) => (base, Some(parse_step(step, spec, expr)?)),
        None => (entry, None),
    };
    let (start, end, star) = match base {
        "?" if !spec.question_mark => {
            return Err(ScheduleError::QuestionMark { expr: expr.to_string(), field: spec.name });
        }
        "*" | "?" => (spec.min, spec.max, true),
        _ => match base.split_once('-') {
            Some((a, b)) => {
                let (start, end) = (parse_value(a, entry, spec, expr)?, parse_value(b, entry, spec, expr)?);
                if start > end {
                    let range = base.to_string();
                    return Err(ScheduleError::BackwardRange { expr: expr.to_string(), field: spec.name, range });
                }
                (start, end, false)
            }
            // `a/n` means from a to the field's maximum in steps of n.
            None => {
                let start = parse_value(base, entry, spec, expr)?;
                (start, if step.is_some() { spec.max } else { start }, false)
            }
        },
    };
    let step = step.unwrap_or(1);
    let bits = (start..=end).step_by(step).fold(0u64, |bits, value| bits | 1 << value);
    Ok((bits, star && step == 1))
}

/// Parses the step after `/`: a whole number of at least 1.
fn parse_step(text: &str, spec: &FieldSpec, expr: &str) -> Result<usize, ScheduleError> {
    match text.parse::<usize>() {
        Ok(step) if step >= 1 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(step),
        _ => Err(ScheduleError::InvalidStep { expr: expr.to_string(), field: spec.name, step: text.to_string() }),
    }
}

/// Parses a number or name within `spec`'s range. Errors quote the whole
/// list `entry`, since a piece of it (the empty start of `-5`) says little.
fn parse_value(text: &str, entry: &str, spec: &FieldSpec, expr: &str) -> Result<u8, ScheduleError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<u8>() {
            Ok(value) if (spec.min..=spec.max).contains(&value) => Ok(value),
            _ => Err(ScheduleError::OutOfRange {
                expr: expr.to_string(),
                field: spec.name,
                value: text.to_string(),
                min: spec.min,
                max: spec.max,
            }),
        };
    }
    match spec.names.iter().position(|name| name.eq_ignore_ascii_case(text)) {
        Some(index) => Ok(spec.min_named + index as u8),
        None => Err(ScheduleError::InvalidValue {
            expr: expr.to_string(),
            field: spec.name,
            value: entry.to_string(),
            allowed: spec.allowed,
        }),
    }
}

/// Looks up `spec.timeZone`; absent means UTC.
fn parse_time_zone(name: Option<&str>) -> Result<TimeZone, ScheduleError> {
    let Some(name) = name else {
        return Ok(TimeZone::UTC);
    };
    // Kubernetes refuses "Local" too: the operator's own zone is an accident
    // of where it happens to be deployed.
    if name.eq_ignore_ascii_case("local") {
        return Err(ScheduleError::UnknownTimeZone(name.to_string()));
    }
    TimeZone::get(name).map_err(|_| ScheduleError::UnknownTimeZone(name.to_string()))
}

/// Day-of-week 7 is another spelling of Sunday (0).
fn fold_sunday(bits: u64) -> u64 {
    if has(bits, 7) { (bits | 1) & !(1 << 7) } else { bits }
}

fn has(bits: u64, value: u8) -> bool {
    (bits >> value) & 1 == 1
}

/// The smallest set bit at or above `from` (which is below 64).
fn first_at_or_after(bits: u64, from: u8) -> Option<u8> {
    let rest = bits >> from;
    (rest != 0).then(|| from + rest.trailing_zeros() as u8)
}

/// The set bits at or above `from`, in increasing order.
fn bits_from(bits: u64, from: u8) -> impl Iterator<Item = u8> {
    (from..64).filter(move |&value| has(bits, value))
}

fn midnight(date: Date) -> DateTime {
    date.to_datetime(Time::midnight())
}

/// The first whole second strictly after `t`, since fire times are whole
/// seconds.
fn next_whole_second(t: Timestamp) -> Option<Timestamp> {
    // `as_second` truncates toward zero, so for a negative `t` with a
    // fraction it already is the next whole second.
    let next = if t.subsec_nanosecond() < 0 { t.as_second() } else { t.as_second().checked_add(1)? };
    Timestamp::from_second(next).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn utc(expr: &str) -> Schedule {
        Schedule::parse(expr, None).unwrap()
    }

    fn zoned(expr: &str, zone: &str) -> Schedule {
        Schedule::parse(expr, Some(zone)).unwrap()
    }

    /// The next `count` fire times after `after`, as RFC 3339 strings.
    fn fires(schedule: &Schedule, after: &str, count: usize) -> Vec<String> {
        let mut at = ts(after);
        (0..count)
            .map(|_| {
                at = schedule.next_after(at).unwrap();
                at.to_string()
            })
            .collect()
    }

    fn error(expr: &str) -> String {
        Schedule::parse(expr, None).unwrap_err().to_string()
    }

    #[test]
    fn a_five_field_schedule_fires_at_second_zero() {
        assert_eq!(
            fires(&utc("* * * * *"), "2024-05-01T10:00:30Z", 2),
            ["2024-05-01T10:01:00Z", "2024-05-01T10:02:00Z"]
        );
    }

    #[test]
    fn every_five_seconds_fires_on_multiples_of_five() {
        assert_eq!(
            fires(&utc("*/5 * * * * *"), "2024-05-01T10:00:58Z", 3),
            ["2024-05-01T10:01:00Z", "2024-05-01T10:01:05Z", "2024-05-01T10:01:10Z"]
        );
    }

    #[test]
    fn a_matching_instant_is_not_its_own_successor() {
        assert_eq!(fires(&utc("0 * * * *"), "2024-05-01T10:00:00Z", 1), ["2024-05-01T11:00:00Z"]);
    }

    #[test]
    fn a_fractional_instant_rounds_up_to_the_next_whole_second() {
        let every_second = utc("* * * * * *");
        assert_eq!(every_second.next_after(ts("2024-05-01T10:00:00.5Z")), Some(ts("2024-05-01T10:00:01Z")));
        assert_eq!(every_second.next_after(ts("1969-12-31T23:59:58.5Z")), Some(ts("1969-12-31T23:59:59Z")));
    }

    #[test]
    fn macros_mean_the_same_as_their_five_fields() {
        for (name, fields) in [
            ("@yearly", "0 0 1 1 *"),
            ("@annually", "0 0 1 1 *"),
            ("@monthly", "0 0 1 * *"),
            ("@weekly", "0 0 * * 0"),
            ("@daily", "0 0 * * *"),
            ("@midnight", "0 0 * * *"),
            ("@hourly", "0 * * * *"),
            ("@DAILY", "0 0 * * *"),
        ] {
            assert_eq!(utc(name), utc(fields), "{name}");
        }
        assert_eq!(fires(&utc("@weekly"), "2024-05-01T10:00:00Z", 1), ["2024-05-05T00:00:00Z"]);
    }

    #[test]
    fn month_and_day_names_are_case_insensitive() {
        assert_eq!(utc("0 0 * jan,Feb,MAR mon-FRI"), utc("0 0 * 1-3 1,2,3,4,5"));
        assert_eq!(utc("0 0 * * sun,Sat"), utc("0 0 * * 0,6"));
    }

    #[test]
    fn zero_and_seven_both_mean_sunday() {
        assert_eq!(utc("0 0 * * 0"), utc("0 0 * * 7"));
        assert_eq!(utc("0 0 * * 5-7"), utc("0 0 * * FRI,SAT,SUN"));
        assert_eq!(
            fires(&utc("0 12 * * 7"), "2024-05-01T00:00:00Z", 2),
            ["2024-05-05T12:00:00Z", "2024-05-12T12:00:00Z"]
        );
    }

    #[test]
    fn ranges_with_steps_skip_between_values() {
        assert_eq!(
            fires(&utc("0 9-17/4 * * *"), "2024-05-01T00:00:00Z", 4),
            ["2024-05-01T09:00:00Z", "2024-05-01T13:00:00Z", "2024-05-01T17:00:00Z", "2024-05-02T09:00:00Z"]
        );
    }

    #[test]
    fn a_single_value_with_a_step_runs_to_the_end_of_the_field() {
        assert_eq!(utc("5/20 * * * *"), utc("5,25,45 * * * *"));
        assert_eq!(utc("*/20 * * * *"), utc("0,20,40 * * * *"));
        assert_eq!(utc("0 0 */10 * *"), utc("0 0 1,11,21,31 * *"));
    }

    #[test]
    fn lists_combine_values_ranges_and_steps() {
        assert_eq!(utc("1,10-12,50/5 * * * *"), utc("1,10,11,12,50,55 * * * *"));
        assert_eq!(
            fires(&utc("0,30 8 * * *"), "2024-05-01T08:10:00Z", 2),
            ["2024-05-01T08:30:00Z", "2024-05-02T08:00:00Z"]
        );
    }

    #[test]
    fn a_question_mark_means_any_day() {
        assert_eq!(utc("0 0 ? * MON"), utc("0 0 * * MON"));
        assert_eq!(utc("0 0 1 * ?"), utc("0 0 1 * *"));
    }

    #[test]
    fn dom_and_dow_both_restricted_match_either() {
        // The 13th of May 2024 is a Monday; Fridays are the 3rd, 10th, 17th.
        assert_eq!(
            fires(&utc("0 0 13 * FRI"), "2024-05-01T00:00:00Z", 4),
            ["2024-05-03T00:00:00Z", "2024-05-10T00:00:00Z", "2024-05-13T00:00:00Z", "2024-05-17T00:00:00Z"]
        );
    }

    #[test]
    fn an_unrestricted_day_field_leaves_the_other_one_alone() {
        assert_eq!(
            fires(&utc("0 0 * * MON"), "2024-05-01T00:00:00Z", 2),
            ["2024-05-06T00:00:00Z", "2024-05-13T00:00:00Z"]
        );
        assert_eq!(
            fires(&utc("0 0 13 * ?"), "2024-05-01T00:00:00Z", 2),
            ["2024-05-13T00:00:00Z", "2024-06-13T00:00:00Z"]
        );
    }

    #[test]
    fn a_stepped_star_restricts_the_day_like_in_kubernetes() {
        // `*/1` is still "any day", so only Mondays match ...
        assert_eq!(fires(&utc("0 0 */1 * MON"), "2024-05-01T00:00:00Z", 1), ["2024-05-06T00:00:00Z"]);
        // ... but `*/2` restricts, so odd days or Mondays match.
        assert_eq!(
            fires(&utc("0 0 */2 * MON"), "2024-05-01T00:00:00Z", 3),
            ["2024-05-03T00:00:00Z", "2024-05-05T00:00:00Z", "2024-05-06T00:00:00Z"]
        );
    }

    #[test]
    fn february_30th_never_fires() {
        assert_eq!(utc("0 0 30 2 *").next_after(ts("2024-01-01T00:00:00Z")), None);
        assert_eq!(utc("0 0 31 4,6,9,11 *").next_after(ts("2024-01-01T00:00:00Z")), None);
    }

    #[test]
    fn the_31st_skips_shorter_months() {
        assert_eq!(
            fires(&utc("0 0 31 * *"), "2024-01-31T00:00:00Z", 2),
            ["2024-03-31T00:00:00Z", "2024-05-31T00:00:00Z"]
        );
    }

    #[test]
    fn a_leap_day_schedule_waits_for_the_next_leap_year() {
        let leap_day = utc("0 0 29 2 *");
        assert_eq!(fires(&leap_day, "2024-03-01T00:00:00Z", 2), ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]);
        // 2100 is no leap year: the longest wait there is.
        assert_eq!(fires(&leap_day, "2096-02-29T00:00:00Z", 1), ["2104-02-29T00:00:00Z"]);
    }

    #[test]
    fn a_search_crosses_the_year_boundary() {
        assert_eq!(fires(&utc("0 0 1 1 *"), "2024-12-31T23:59:59Z", 1), ["2025-01-01T00:00:00Z"]);
        assert_eq!(fires(&utc("59 59 23 31 12 *"), "2024-12-31T23:59:59Z", 1), ["2025-12-31T23:59:59Z"]);
        assert_eq!(fires(&utc("0 0 * JAN MON"), "2024-12-01T00:00:00Z", 1), ["2025-01-06T00:00:00Z"]);
    }

    #[test]
    fn the_end_of_time_yields_none_instead_of_panicking() {
        assert_eq!(utc("* * * * * *").next_after(Timestamp::MAX), None);
        assert_eq!(utc("0 0 1 1 *").next_after(ts("9999-06-01T00:00:00Z")), None);
        let almost_max = Timestamp::from_second(Timestamp::MAX.as_second() - 2).unwrap();
        assert_eq!(utc("* * * * * *").next_after(almost_max), Some(almost_max + SignedDuration::from_secs(1)));
        assert_eq!(zoned("* * * * * *", "Pacific/Kiritimati").next_after(Timestamp::MAX), None);
    }

    #[test]
    fn fields_are_read_in_the_schedules_time_zone() {
        let nine_in_berlin = zoned("0 9 * * *", "Europe/Berlin");
        assert_eq!(fires(&nine_in_berlin, "2024-01-15T00:00:00Z", 1), ["2024-01-15T08:00:00Z"]);
        assert_eq!(fires(&nine_in_berlin, "2024-07-15T00:00:00Z", 1), ["2024-07-15T07:00:00Z"]);
        // Day and month are local too: midnight on New Year in Tokyo.
        assert_eq!(fires(&zoned("@yearly", "Asia/Tokyo"), "2024-06-01T00:00:00Z", 1), ["2024-12-31T15:00:00Z"]);
    }

    #[test]
    fn no_time_zone_and_utc_are_the_same() {
        assert_eq!(utc("0 9 * * *"), zoned("0 9 * * *", "UTC"));
    }

    #[test]
    fn a_nonexistent_local_time_runs_at_the_end_of_the_spring_gap() {
        // New York, 2024-03-10: 02:00 EST jumps to 03:00 EDT (07:00Z).
        assert_eq!(
            fires(&zoned("30 2 * * *", "America/New_York"), "2024-03-09T00:00:00Z", 3),
            ["2024-03-09T07:30:00Z", "2024-03-10T07:00:00Z", "2024-03-11T06:30:00Z"]
        );
        // Berlin, 2024-03-31: 02:00 CET jumps to 03:00 CEST (01:00Z).
        assert_eq!(
            fires(&zoned("15 2 * * *", "Europe/Berlin"), "2024-03-30T12:00:00Z", 2),
            ["2024-03-31T01:00:00Z", "2024-04-01T00:15:00Z"]
        );
    }

    #[test]
    fn all_matches_inside_a_spring_gap_fire_once_at_its_end() {
        assert_eq!(
            fires(&zoned("*/15 * * * *", "America/New_York"), "2024-03-10T06:40:00Z", 4),
            ["2024-03-10T06:45:00Z", "2024-03-10T07:00:00Z", "2024-03-10T07:15:00Z", "2024-03-10T07:30:00Z"]
        );
        // Far in the future the zone's rule, not its table, supplies the gap.
        assert_eq!(
            fires(&zoned("30 2 * * *", "America/New_York"), "2090-03-12T00:00:00Z", 1),
            ["2090-03-12T07:00:00Z"]
        );
    }

    #[test]
    fn a_repeated_local_time_fires_once_in_autumn() {
        // New York, 2024-11-03: 02:00 EDT falls back to 01:00 EST (06:00Z).
        let half_past_one = zoned("30 1 * * *", "America/New_York");
        assert_eq!(fires(&half_past_one, "2024-11-03T00:00:00Z", 2), ["2024-11-03T05:30:00Z", "2024-11-04T06:30:00Z"]);
        // Asked from inside the second pass, the repeat is still skipped.
        assert_eq!(fires(&half_past_one, "2024-11-03T06:15:00Z", 1), ["2024-11-04T06:30:00Z"]);
    }

    #[test]
    fn an_hourly_schedule_skips_the_repeated_hour() {
        // Berlin, 2024-10-27: 03:00 CEST falls back to 02:00 CET (01:00Z).
        assert_eq!(
            fires(&zoned("@hourly", "Europe/Berlin"), "2024-10-26T23:30:00Z", 3),
            ["2024-10-27T00:00:00Z", "2024-10-27T02:00:00Z", "2024-10-27T03:00:00Z"]
        );
        let every_ten_seconds = zoned("*/10 * * * * *", "Europe/Berlin");
        assert_eq!(fires(&every_ten_seconds, "2024-10-27T01:30:00Z", 1), ["2024-10-27T02:00:00Z"]);
    }

    #[test]
    fn daylight_saving_transitions_agree_with_a_brute_force_oracle() {
        let windows = [
            ("America/New_York", "2024-03-10T05:00:00Z"),
            ("America/New_York", "2024-11-03T04:00:00Z"),
            ("Europe/Berlin", "2024-03-31T00:00:00Z"),
            ("Europe/Berlin", "2024-10-26T23:00:00Z"),
            ("Australia/Lord_Howe", "2024-04-06T14:00:00Z"),
        ];
        for (zone, start) in windows {
            for expr in ["*/15 * * * *", "30 * * * *", "0 1,2 * * *", "*/7 */13 * * * *", "0 30-45/5 2 * * *"] {
                let schedule = zoned(expr, zone);
                let start = ts(start);
                let end = start + SignedDuration::from_hours(4);
                let mut expected = Vec::new();
                let mut at = start + SignedDuration::from_secs(1);
                while at <= end {
                    if oracle::fires_at(&schedule, at) {
                        expected.push(at);
                    }
                    at += SignedDuration::from_secs(1);
                }
                let mut actual = Vec::new();
                let mut at = start;
                while let Some(next) = schedule.next_after(at).filter(|&next| next <= end) {
                    actual.push(next);
                    at = next;
                }
                assert_eq!(actual, expected, "{expr} in {zone} from {start}");
            }
        }
    }

    #[test]
    fn extra_whitespace_between_fields_is_fine() {
        assert_eq!(utc("  0  9\t* *   MON "), utc("0 9 * * MON"));
    }

    #[test]
    fn out_of_range_values_name_the_field_and_its_range() {
        assert_eq!(error("61 * * * *"), "schedule '61 * * * *': minute 61 is out of range 0-59");
        assert_eq!(error("60 * * * * *"), "schedule '60 * * * * *': second 60 is out of range 0-59");
        assert_eq!(error("0 24 * * *"), "schedule '0 24 * * *': hour 24 is out of range 0-23");
        assert_eq!(error("0 0 0 * *"), "schedule '0 0 0 * *': day-of-month 0 is out of range 1-31");
        assert_eq!(error("0 0 32 * *"), "schedule '0 0 32 * *': day-of-month 32 is out of range 1-31");
        assert_eq!(error("0 0 * 13 *"), "schedule '0 0 * 13 *': month 13 is out of range 1-12");
        assert_eq!(error("0 0 * * 8"), "schedule '0 0 * * 8': day-of-week 8 is out of range 0-7");
        assert_eq!(error("0 1-99 * * *"), "schedule '0 1-99 * * *': hour 99 is out of range 0-23");
        assert_eq!(
            error("99999999999999999999 * * * *"),
            "schedule '99999999999999999999 * * * *': minute 99999999999999999999 is out of range 0-59"
        );
    }

    #[test]
    fn unknown_values_say_what_the_field_accepts() {
        assert_eq!(
            error("0 0 * FOO *"),
            "schedule '0 0 * FOO *': month 'FOO' is not valid; use a number 1-12 or a name JAN-DEC"
        );
        assert_eq!(
            error("0 0 * * MONDAY"),
            "schedule '0 0 * * MONDAY': day-of-week 'MONDAY' is not valid; use a number 0-7 (0 and 7 are Sunday) or a name SUN-SAT"
        );
        assert_eq!(error("0 JAN * * *"), "schedule '0 JAN * * *': hour 'JAN' is not valid; use a number 0-23");
        assert_eq!(error("-5 * * * *"), "schedule '-5 * * * *': minute '-5' is not valid; use a number 0-59");
        assert_eq!(error("*-5 * * * *"), "schedule '*-5 * * * *': minute '*-5' is not valid; use a number 0-59");
    }

    #[test]
    fn bad_steps_ask_for_a_positive_whole_number() {
        assert_eq!(
            error("*/0 * * * *"),
            "schedule '*/0 * * * *': minute step '0' is not valid; use a whole number of at least 1, e.g. */5"
        );
        assert_eq!(
            error("*/x * * * *"),
            "schedule '*/x * * * *': minute step 'x' is not valid; use a whole number of at least 1, e.g. */5"
        );
        assert_eq!(
            error("0 */ * * *"),
            "schedule '0 */ * * *': hour step '' is not valid; use a whole number of at least 1, e.g. */5"
        );
        assert_eq!(
            error("*/+2 * * * *"),
            "schedule '*/+2 * * * *': minute step '+2' is not valid; use a whole number of at least 1, e.g. */5"
        );
    }

    #[test]
    fn a_backwards_range_is_refused() {
        assert_eq!(
            error("0 22-2 * * *"),
            "schedule '0 22-2 * * *': hour range '22-2' runs backwards; the start must not be greater than the end (split a wrap-around into two ranges, e.g. 22-23,0-2)"
        );
        assert!(matches!(Schedule::parse("0 0 * * FRI-MON", None), Err(ScheduleError::BackwardRange { .. })));
    }

    #[test]
    fn the_wrong_number_of_fields_is_refused() {
        let expected = |expr: &str, n: usize| {
            format!(
                "schedule '{expr}': expected 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds field, found {n}"
            )
        };
        assert_eq!(error("* * * *"), expected("* * * *", 4));
        assert_eq!(error("0 0 0 * * * 2024"), expected("0 0 0 * * * 2024", 7));
        assert_eq!(
            error("   "),
            "schedule is empty: write five fields (minute hour day-of-month month day-of-week), e.g. '0 3 * * *', or a macro such as @daily"
        );
    }

    #[test]
    fn empty_list_entries_and_misplaced_question_marks_are_refused() {
        assert_eq!(
            error("1,,2 * * * *"),
            "schedule '1,,2 * * * *': minute has an empty entry; separate values with single commas, e.g. 1,15,30"
        );
        assert_eq!(
            error("0 ? * * *"),
            "schedule '0 ? * * *': '?' is only allowed in day-of-month and day-of-week, not in hour"
        );
    }

    #[test]
    fn unknown_macros_and_macros_with_fields_are_refused() {
        assert_eq!(
            error("@every 5m"),
            "schedule '@every 5m': unknown macro '@every'; use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly"
        );
        assert_eq!(error("@daily 0"), "schedule '@daily 0': @daily must stand alone; remove the fields after it");
    }

    #[test]
    fn time_zone_prefixes_in_the_schedule_are_refused() {
        assert_eq!(
            error("CRON_TZ=Europe/Berlin 0 9 * * *"),
            "schedule 'CRON_TZ=Europe/Berlin 0 9 * * *': 'CRON_TZ=Europe/Berlin' is not allowed in the schedule; set spec.timeZone instead"
        );
        assert_eq!(
            error("TZ=UTC 0 9 * * *"),
            "schedule 'TZ=UTC 0 9 * * *': 'TZ=UTC' is not allowed in the schedule; set spec.timeZone instead"
        );
    }

    #[test]
    fn unknown_time_zones_are_refused_with_an_example() {
        for zone in ["Mars/Base", "Local", "", "+02:00"] {
            assert_eq!(
                Schedule::parse("0 9 * * *", Some(zone)).unwrap_err().to_string(),
                format!("unknown time zone '{zone}': use an IANA name such as Europe/Berlin or UTC")
            );
        }
    }

    /// An independent, second-by-second notion of "fires at", following the
    /// module's daylight saving rules.
    mod oracle {
        use super::super::*;

        fn matches(s: &Schedule, civil: DateTime) -> bool {
            let bit = |bits: u64, value: i8| (bits >> value) & 1 == 1;
            let dom = bit(s.days_of_month, civil.day());
            let dow = bit(s.days_of_week, civil.weekday().to_sunday_zero_offset());
            let day = if s.either_day { dom || dow } else { dom && dow };
            day && bit(s.seconds, civil.second())
                && bit(s.minutes, civil.minute())
                && bit(s.hours, civil.hour())
                && bit(s.months, civil.month())
        }

        pub fn fires_at(s: &Schedule, at: Timestamp) -> bool {
            let civil = s.tz.to_datetime(at);
            let first_occurrence = s.tz.to_ambiguous_timestamp(civil).earlier().ok() == Some(at);
            if first_occurrence && matches(s, civil) {
                return true;
            }
            // Civil times skipped just before `at` (a gap) fire at `at`.
            let second = SignedDuration::from_secs(1);
            let mut skipped = s.tz.to_datetime(at - second) + second;
            while skipped < civil {
                if matches(s, skipped) {
                    return true;
                }
                skipped += second;
            }
            false
        }
    }

    mod properties {
        use super::super::*;
        use super::oracle;
        use proptest::prelude::*;

        fn field(min: u8, max: u8, star_weight: u32) -> impl Strategy<Value = String> {
            let entry = prop_oneof![
                (1..=max).prop_map(|n| format!("*/{n}")),
                (min..=max).prop_map(|a| a.to_string()),
                (min..=max, min..=max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
                (min..=max, min..=max, 1..=max).prop_map(|(a, b, n)| format!("{}-{}/{n}", a.min(b), a.max(b))),
                (min..=max, 1..=max).prop_map(|(a, n)| format!("{a}/{n}")),
            ];
            prop_oneof![
                star_weight => Just("*".to_string()),
                4 => prop::collection::vec(entry, 1..=3).prop_map(|entries| entries.join(",")),
            ]
        }

        /// Six-field expressions, dense enough in the small units that a
        /// brute-force window usually contains the next fire time.
        fn expression() -> impl Strategy<Value = String> {
            (field(0, 59, 1), field(0, 59, 1), field(0, 23, 2), field(1, 31, 6), field(1, 12, 8), field(0, 7, 6))
                .prop_map(|(s, m, h, dom, mon, dow)| format!("{s} {m} {h} {dom} {mon} {dow}"))
        }

        /// Checks `next_after(after)` against the oracle on a window of
        /// `window_secs` seconds after `after`.
        fn check(schedule: &Schedule, after: Timestamp, window_secs: i64) -> Result<(), TestCaseError> {
            let next = schedule.next_after(after);
            let end = after + SignedDuration::from_secs(window_secs);
            if let Some(next) = next {
                prop_assert!(next > after);
                prop_assert!(oracle::fires_at(schedule, next), "{next} does not match");
            }
            let mut at = after + SignedDuration::from_nanos(1_000_000_000 - i64::from(after.subsec_nanosecond()));
            while at < end && next.is_none_or(|next| at < next) {
                prop_assert!(!oracle::fires_at(schedule, at), "missed {at}, returned {next:?}");
                at += SignedDuration::from_secs(1);
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]

            #[test]
            fn next_after_is_the_first_matching_second_in_utc(
                expr in expression(),
                seconds in 1_577_836_800i64..1_893_456_000,
                nanos in 0i32..1_000_000_000,
            ) {
                let schedule = Schedule::parse(&expr, None).unwrap();
                check(&schedule, Timestamp::new(seconds, nanos).unwrap(), 30 * 3600)?;
            }

            #[test]
            fn next_after_is_the_first_matching_second_around_transitions(
                expr in expression(),
                zone in prop::sample::select(vec![
                    "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kathmandu",
                ]),
                year in 2000i16..2040,
                nth in 0usize..2,
                offset_secs in -3 * 3600i64..3 * 3600,
            ) {
                let schedule = Schedule::parse(&expr, Some(zone)).unwrap();
                let year_start = jiff::civil::date(year, 1, 1).to_zoned(TimeZone::UTC).unwrap().timestamp();
                let transition = schedule.tz.following(year_start).nth(nth).map_or(year_start, |t| t.timestamp());
                check(&schedule, transition + SignedDuration::from_secs(offset_secs), 6 * 3600)?;
            }
        }
    }
}

//! Sync windows (`spec.syncWindows`), as Argo CD's: which are open at a
//! moment, and whether they hold syncs back. Pure: the moment is given.
//!
//! Schedules are standard five-field cron (minute hour day-of-month month
//! day-of-week, Sunday 0 or 7), evaluated by `jiff-cron` in the window's
//! time zone (so a window at 02:00 follows daylight saving time). That
//! crate counts days of the week from Sunday = 1; [`cron_for_jiff`]
//! rewrites the day-of-week field's numbers, and adds the seconds field.

use std::str::FromStr;

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

use crate::api::{SyncWindow, WindowKind};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WindowError {
    #[error("spec.syncWindows[{index}].schedule {schedule:?}: {message}")]
    Schedule {
        index: usize,
        schedule: String,
        message: String,
    },
    #[error(
        "spec.syncWindows[{index}].duration {duration:?}: expected a number and a unit (d, h, m or s), e.g. 1h30m"
    )]
    Duration { index: usize, duration: String },
    #[error("spec.syncWindows[{index}].timeZone {zone:?}: not a known IANA time zone")]
    TimeZone { index: usize, zone: String },
}

/// One window, parsed.
#[derive(Debug, Clone)]
pub struct Window {
    pub index: usize,
    pub kind: WindowKind,
    schedule: jiff_cron::Schedule,
    /// As written, for messages.
    pub spec: String,
    duration: SignedDuration,
    zone: TimeZone,
    pub manual_sync: bool,
}

/// The windows of an Application, parsed; the first error names its field.
pub fn parse(windows: &[SyncWindow]) -> Result<Vec<Window>, WindowError> {
    windows
        .iter()
        .enumerate()
        .map(|(index, w)| {
            let schedule = cron_for_jiff(&w.schedule)
                .and_then(|text| jiff_cron::Schedule::from_str(&text).map_err(|e| e.to_string()))
                .map_err(|message| WindowError::Schedule {
                    index,
                    schedule: w.schedule.clone(),
                    message,
                })?;
            let duration = parse_duration(&w.duration).ok_or_else(|| WindowError::Duration {
                index,
                duration: w.duration.clone(),
            })?;
            let zone = match w.time_zone.as_deref().map(str::trim) {
                None | Some("") => TimeZone::UTC,
                Some(name) => TimeZone::get(name).map_err(|_| WindowError::TimeZone {
                    index,
                    zone: name.to_string(),
                })?,
            };
            let kind = match w.kind {
                WindowKind::Allow => "allow",
                WindowKind::Deny => "deny",
            };
            Ok(Window {
                index,
                kind: w.kind,
                schedule,
                spec: format!(
                    "{kind} window {:?} for {} ({})",
                    w.schedule,
                    w.duration,
                    w.time_zone.as_deref().unwrap_or("UTC")
                ),
                duration,
                zone,
                manual_sync: w.manual_sync,
            })
        })
        .collect()
}

/// Whether syncs may run at a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Open,
    Closed {
        /// When that may change: the end of the deny windows open now, or
        /// the next opening of an allow window; None when never.
        until: Option<Timestamp>,
        /// Every window that holds syncs back allows manual ones.
        manual_sync: bool,
        /// Which windows hold syncs back, for the status.
        why: String,
    },
}

/// Deny wins over allow; without allow windows, syncs are allowed but for
/// the deny windows open now.
pub fn state(windows: &[Window], now: Timestamp) -> State {
    let denying: Vec<(&Window, Timestamp)> = windows
        .iter()
        .filter(|w| w.kind == WindowKind::Deny)
        .filter_map(|w| open_until(w, now).map(|end| (w, end)))
        .collect();
    if !denying.is_empty() {
        let until = denying.iter().map(|(_, end)| *end).max();
        return State::Closed {
            until,
            manual_sync: denying.iter().all(|(w, _)| w.manual_sync),
            why: format!(
                "inside the {}",
                denying
                    .iter()
                    .map(|(w, _)| w.spec.as_str())
                    .collect::<Vec<_>>()
                    .join(" and the ")
            ),
        };
    }
    let allows: Vec<&Window> = windows
        .iter()
        .filter(|w| w.kind == WindowKind::Allow)
        .collect();
    if allows.is_empty() || allows.iter().any(|w| open_until(w, now).is_some()) {
        return State::Open;
    }
    State::Closed {
        until: allows.iter().filter_map(|w| next_opening(w, now)).min(),
        manual_sync: allows.iter().any(|w| w.manual_sync),
        why: format!(
            "outside every allow window ({})",
            allows
                .iter()
                .map(|w| w.spec.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Bounds a walk over a schedule's times (a window every minute for a day
/// is 1,440 of them).
const MAX_TIMES: usize = 100_000;

/// The end of the window's latest opening that is still open at `now`.
fn open_until(window: &Window, now: Timestamp) -> Option<Timestamp> {
    let start = now.checked_sub(window.duration).ok()?;
    let from = start.to_zoned(window.zone.clone());
    window
        .schedule
        .after(from)
        .take(MAX_TIMES)
        .map(|opened| opened.timestamp())
        .take_while(|opened| *opened <= now)
        .filter_map(|opened| opened.checked_add(window.duration).ok())
        .filter(|end| *end > now)
        .max()
}

fn next_opening(window: &Window, now: Timestamp) -> Option<Timestamp> {
    window
        .schedule
        .after(now.to_zoned(window.zone.clone()))
        .next()
        .map(|z| z.timestamp())
}

/// Standard cron (five fields, day of week 0–7 with Sunday 0 and 7) as
/// jiff-cron reads it (seconds first, Sunday 1 … Saturday 7).
pub fn cron_for_jiff(schedule: &str) -> Result<String, String> {
    let fields: Vec<&str> = schedule.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected 5 fields (minute hour day-of-month month day-of-week), found {}",
            fields.len()
        ));
    }
    let days = fields[4]
        .split(',')
        .map(day_item)
        .collect::<Result<Vec<_>, _>>()?
        .join(",");
    Ok(format!(
        "0 {} {} {} {} {days}",
        fields[0], fields[1], fields[2], fields[3]
    ))
}

/// One item of the day-of-week list: `*`, `*/2`, `1`, `1-5`, `1-5/2`, `MON`.
fn day_item(item: &str) -> Result<String, String> {
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => (range, Some(step)),
        None => (item, None),
    };
    let day = |text: &str| -> Result<Option<u32>, String> {
        match text.parse::<u32>() {
            Ok(n) if n <= 7 => Ok(Some(n % 7 + 1)),
            Ok(n) => Err(format!("day of week {n} is not within 0-7")),
            Err(_) => Ok(None), // a name, which jiff-cron reads as it is
        }
    };
    let shifted = match range.split_once('-') {
        Some((from, to)) => {
            let (a, b) = (day(from)?, day(to)?);
            match (a, b, to) {
                // `5-7` ends on Sunday, 1 in jiff-cron's count.
                (Some(a), Some(1), "7") if a > 1 && step.is_none() => format!("{a}-7,1"),
                (Some(_), Some(1), "7") => {
                    return Err("a day-of-week range ending at 7 cannot have a step".into());
                }
                (a, b, _) => format!(
                    "{}-{}",
                    a.map_or(from.to_string(), |n| n.to_string()),
                    b.map_or(to.to_string(), |n| n.to_string())
                ),
            }
        }
        None if range == "*" => "*".to_string(),
        None => day(range)?.map_or(range.to_string(), |n| n.to_string()),
    };
    Ok(match step {
        Some(step) => format!("{shifted}/{step}"),
        None => shifted,
    })
}

/// `1h30m`, `45m`, `2d`, `90s`: a sum of numbers with units.
pub fn parse_duration(text: &str) -> Option<SignedDuration> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut total: i64 = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: i64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(unit)?)?;
    }
    (number.is_empty() && total > 0).then(|| SignedDuration::from_secs(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(kind: WindowKind, schedule: &str, duration: &str, zone: Option<&str>) -> SyncWindow {
        SyncWindow {
            kind,
            schedule: schedule.into(),
            duration: duration.into(),
            time_zone: zone.map(Into::into),
            manual_sync: false,
        }
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn standard_days_of_week_become_jiff_crons() {
        assert_eq!(cron_for_jiff("0 22 * * *").unwrap(), "0 0 22 * * *");
        assert_eq!(cron_for_jiff("0 9 * * 1-5").unwrap(), "0 0 9 * * 2-6");
        assert_eq!(cron_for_jiff("0 9 * * 0,6").unwrap(), "0 0 9 * * 1,7");
        assert_eq!(cron_for_jiff("0 9 * * 7").unwrap(), "0 0 9 * * 1");
        assert_eq!(cron_for_jiff("0 9 * * 5-7").unwrap(), "0 0 9 * * 6-7,1");
        assert_eq!(
            cron_for_jiff("0 9 * * MON-FRI").unwrap(),
            "0 0 9 * * MON-FRI"
        );
        assert_eq!(cron_for_jiff("*/15 * * * */2").unwrap(), "0 */15 * * * */2");
        assert!(cron_for_jiff("0 9 * *").is_err());
        assert!(cron_for_jiff("0 9 * * 8").is_err());
    }

    #[test]
    fn durations_add_their_units() {
        assert_eq!(
            parse_duration("1h30m"),
            Some(SignedDuration::from_secs(5400))
        );
        assert_eq!(
            parse_duration("2d"),
            Some(SignedDuration::from_secs(172_800))
        );
        assert_eq!(parse_duration("45s"), Some(SignedDuration::from_secs(45)));
        assert_eq!(parse_duration("1h30"), None);
        assert_eq!(parse_duration("1w"), None);
        assert_eq!(parse_duration("0m"), None);
        assert_eq!(parse_duration(""), None);
    }

    #[test]
    fn a_deny_window_holds_syncs_until_it_ends() {
        // Weekdays 22:00 for 2 hours, Paris time (UTC+1 in December).
        let w = parse(&[window(
            WindowKind::Deny,
            "0 22 * * 1-5",
            "2h",
            Some("Europe/Paris"),
        )])
        .unwrap();
        // Monday 2026-12-07 21:30 UTC is 22:30 in Paris: inside.
        match state(&w, at("2026-12-07T21:30:00Z")) {
            State::Closed {
                until,
                manual_sync,
                why,
            } => {
                assert_eq!(until, Some(at("2026-12-07T23:00:00Z")));
                assert!(!manual_sync);
                assert!(why.contains("deny window \"0 22 * * 1-5\""), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(state(&w, at("2026-12-07T23:00:00Z")), State::Open);
        assert_eq!(state(&w, at("2026-12-07T20:59:59Z")), State::Open);
        // Saturday: no window.
        assert_eq!(state(&w, at("2026-12-12T21:30:00Z")), State::Open);
    }

    #[test]
    fn allow_windows_close_everything_else_and_say_when_the_next_opens() {
        let w = parse(&[window(WindowKind::Allow, "0 9 * * *", "1h", None)]).unwrap();
        assert_eq!(state(&w, at("2026-12-07T09:10:00Z")), State::Open);
        match state(&w, at("2026-12-07T10:00:00Z")) {
            State::Closed { until, .. } => assert_eq!(until, Some(at("2026-12-08T09:00:00Z"))),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deny_wins_over_allow_and_manual_sync_needs_every_holding_window() {
        let mut deny = window(WindowKind::Deny, "* * * * *", "1h", None);
        deny.manual_sync = true;
        let allow = window(WindowKind::Allow, "* * * * *", "1h", None);
        let w = parse(&[allow, deny.clone()]).unwrap();
        match state(&w, at("2026-12-07T12:00:30Z")) {
            State::Closed {
                until, manual_sync, ..
            } => {
                // Every minute opens another hour.
                assert_eq!(until, Some(at("2026-12-07T13:00:00Z")));
                assert!(manual_sync);
            }
            other => panic!("{other:?}"),
        }
        let mut strict = deny;
        strict.manual_sync = false;
        strict.schedule = "0 12 * * *".into();
        let w = parse(&[window(WindowKind::Deny, "* * * * *", "1h", None), strict]).unwrap();
        match state(&w, at("2026-12-07T12:00:30Z")) {
            State::Closed { manual_sync, .. } => assert!(!manual_sync),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_windows_name_their_field() {
        let e = parse(&[window(WindowKind::Deny, "0 25 * * *", "1h", None)]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("spec.syncWindows[0].schedule \"0 25 * * *\""),
            "{e}"
        );
        let e = parse(&[window(WindowKind::Deny, "0 2 * * *", "1 hour", None)]).unwrap_err();
        assert!(matches!(e, WindowError::Duration { index: 0, .. }), "{e}");
        let e = parse(&[window(
            WindowKind::Deny,
            "0 2 * * *",
            "1h",
            Some("Mars/Olympus"),
        )])
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.syncWindows[0].timeZone \"Mars/Olympus\": not a known IANA time zone"
        );
    }
}

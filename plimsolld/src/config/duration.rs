//! Go-style duration text (`30m`, `90s`, `1h30m`, `500ms`), as config.md section 1 requires.
//!
//! Upstream reads its duration variables with Go's `time.ParseDuration`, so operators already
//! write values in that syntax. This module accepts the same language: an optional sign, then one
//! or more `<number><unit>` pieces where the number may carry a fraction (`1.5h`, `.5s`) and the
//! unit is one of `ns`, `us`, `µs`, `μs`, `ms`, `s`, `m`, `h`. A bare `0` is the only value
//! allowed without a unit.
//!
//! Two differences from Go, both refusals: a negative duration (other than `-0`) is an error,
//! because no setting of ours means anything below zero, and the text is not trimmed here (the
//! config layer trims variables before it calls [`parse_duration`]).

use std::time::Duration;

/// Go's limit: a duration is an `int64` count of nanoseconds.
const MAX_NANOS: u128 = i64::MAX as u128;

/// Fraction digits beyond this many cannot change the result by a nanosecond, even for hours.
const MAX_FRACTION_DIGITS: u32 = 19;

/// Why a duration text was refused. The text itself is carried so the message can quote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The text was empty.
    #[error("empty duration")]
    Empty,
    /// The text does not follow `[-+]?(<number><unit>)+`.
    #[error("invalid duration {0:?}: expected a number followed by a unit, e.g. 30m, 90s, 1h30m")]
    Invalid(String),
    /// A number had no unit after it (a bare `30`); only `0` may stand alone.
    #[error(
        "missing unit in duration {0:?}: write e.g. 30s or 30m (a bare 0 is the only unitless value)"
    )]
    MissingUnit(String),
    /// The unit is not one of Go's.
    #[error("unknown unit {unit:?} in duration {text:?}: use ns, us, ms, s, m or h")]
    UnknownUnit {
        /// The whole text.
        text: String,
        /// The unit as written.
        unit: String,
    },
    /// The value is larger than Go's limit of about 292 years.
    #[error("duration {0:?} is too large")]
    Overflow(String),
    /// The value is below zero.
    #[error("duration {0:?} is negative")]
    Negative(String),
}

/// Parses Go duration syntax into a [`Duration`].
///
/// Accepts exactly what Go's `time.ParseDuration` accepts, except negative values (refused) and
/// values above `i64::MAX` nanoseconds (refused, as in Go). Fractions are computed exactly and
/// truncated to the nanosecond. Does not trim whitespace and does not apply any range: callers
/// check their own bounds (for example `[1s, 12h]` for session lifetimes).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(text.to_owned());
    let (negative, body) = match text.as_bytes().first() {
        None => return Err(DurationError::Empty),
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        Some(_) => (false, text),
    };
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    if body.is_empty() {
        return Err(invalid());
    }

    let mut rest = body;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (whole, after_whole) = take_digits(rest);
        let (fraction, after_fraction) = match after_whole.strip_prefix('.') {
            Some(after_dot) => {
                let (digits, after) = take_digits(after_dot);
                (Some(digits), after)
            }
            None => (None, after_whole),
        };
        if whole.is_empty() && fraction.is_none_or(str::is_empty) {
            return Err(invalid());
        }
        let unit_len = after_fraction
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after_fraction.len());
        let unit = &after_fraction[..unit_len];
        if unit.is_empty() {
            return Err(DurationError::MissingUnit(text.to_owned()));
        }
        let Some(unit_nanos) = unit_in_nanos(unit) else {
            return Err(DurationError::UnknownUnit {
                text: text.to_owned(),
                unit: unit.to_owned(),
            });
        };
        let piece = piece_nanos(whole, fraction.unwrap_or(""), unit_nanos)
            .ok_or_else(|| DurationError::Overflow(text.to_owned()))?;
        total = total
            .checked_add(piece)
            .filter(|t| *t <= MAX_NANOS)
            .ok_or_else(|| DurationError::Overflow(text.to_owned()))?;
        rest = &after_fraction[unit_len..];
    }

    if negative && total > 0 {
        return Err(DurationError::Negative(text.to_owned()));
    }
    // `total <= MAX_NANOS < u64::MAX`, so the conversion cannot fail.
    let nanos = u64::try_from(total).map_err(|_| DurationError::Overflow(text.to_owned()))?;
    Ok(Duration::from_nanos(nanos))
}

/// Splits off the leading run of ASCII digits.
fn take_digits(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    text.split_at(end)
}

fn unit_in_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        // Go accepts both the micro sign (U+00B5) and the Greek small mu (U+03BC).
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        _ => return None,
    })
}

/// `whole.fraction × unit` in nanoseconds, or `None` past Go's limit.
fn piece_nanos(whole: &str, fraction: &str, unit_nanos: u128) -> Option<u128> {
    let mut value: u128 = 0;
    for digit in whole.bytes() {
        value = value
            .checked_mul(10)?
            .checked_add(u128::from(digit - b'0'))
            .filter(|v| *v <= MAX_NANOS)?;
    }
    let mut nanos = value.checked_mul(unit_nanos).filter(|n| *n <= MAX_NANOS)?;

    let mut numerator: u128 = 0;
    let mut scale: u128 = 1;
    for digit in fraction.bytes().take(MAX_FRACTION_DIGITS as usize) {
        numerator = numerator * 10 + u128::from(digit - b'0');
        scale *= 10;
    }
    // numerator < 10^19 and unit_nanos < 2^42, so the product fits easily in u128.
    nanos = nanos.checked_add(numerator * unit_nanos / scale)?;
    Some(nanos)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Duration {
        match parse_duration(text) {
            Ok(d) => d,
            Err(e) => panic!("{text:?} should parse: {e}"),
        }
    }

    #[test]
    fn common_units_parse() {
        assert_eq!(ok("30m"), Duration::from_secs(30 * 60));
        assert_eq!(ok("90s"), Duration::from_secs(90));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("3us"), Duration::from_micros(3));
    }

    #[test]
    fn both_micro_spellings_are_accepted() {
        assert_eq!(ok("3\u{b5}s"), Duration::from_micros(3));
        assert_eq!(ok("3\u{3bc}s"), Duration::from_micros(3));
    }

    #[test]
    fn pieces_add_up() {
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("1h0m10s"), Duration::from_secs(3610));
        assert_eq!(ok("1s500ms"), Duration::from_millis(1500));
    }

    #[test]
    fn fractions_are_exact_and_truncate_to_the_nanosecond() {
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("5.s"), Duration::from_secs(5));
        assert_eq!(ok("0.0000000015s"), Duration::from_nanos(1));
        assert_eq!(ok("1.000000000000000000000001s"), Duration::from_secs(1));
    }

    #[test]
    fn bare_zero_is_allowed_with_any_sign() {
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("+0"), Duration::ZERO);
        assert_eq!(ok("-0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("-0s"), Duration::ZERO);
    }

    #[test]
    fn plus_sign_is_accepted() {
        assert_eq!(ok("+5s"), Duration::from_secs(5));
    }

    #[test]
    fn bare_number_without_unit_is_refused() {
        assert_eq!(
            parse_duration("30"),
            Err(DurationError::MissingUnit("30".into()))
        );
        assert_eq!(
            parse_duration("1h30"),
            Err(DurationError::MissingUnit("1h30".into()))
        );
    }

    #[test]
    fn empty_and_malformed_texts_are_refused() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for bad in ["-", "+", ".", ".s", "s", "1..5s", " 5s", "5s ", "5 s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn unknown_units_are_refused_and_named() {
        assert_eq!(
            parse_duration("5d"),
            Err(DurationError::UnknownUnit {
                text: "5d".into(),
                unit: "d".into()
            })
        );
        assert!(matches!(
            parse_duration("5S"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_duration("5sec"),
            Err(DurationError::UnknownUnit { .. })
        ));
    }

    #[test]
    fn negative_durations_are_refused() {
        assert_eq!(
            parse_duration("-5s"),
            Err(DurationError::Negative("-5s".into()))
        );
    }

    #[test]
    fn values_past_go_limit_overflow() {
        // Go's largest duration is 2562047h47m16.854775807s.
        assert_eq!(
            ok("2562047h47m16.854775807s"),
            Duration::from_nanos(i64::MAX as u64)
        );
        assert!(matches!(
            parse_duration("2562047h47m16.854775808s"),
            Err(DurationError::Overflow(_))
        ));
        assert!(matches!(
            parse_duration("9999999999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn unicode_digits_are_refused() {
        assert!(parse_duration("\u{0665}s").is_err());
    }
}

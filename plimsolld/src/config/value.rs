//! How one variable's text becomes a number or a boolean (config.md section 1).
//!
//! These functions see the text after trimming and after the caller has decided what an empty
//! value means (the default). They never look at the environment themselves.

/// Why a scalar text was refused; the caller adds the variable's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScalarError {
    /// Not a plain decimal integer (`1e3`, `0x10`, Unicode digits, `1.5`).
    NotInteger,
    /// A decimal integer below the accepted minimum.
    BelowMinimum,
    /// A decimal integer above the accepted maximum.
    AboveMaximum,
    /// Not one of `0`, `1`, `false`, `true` (any case).
    NotBoolean,
    /// Not a decimal number, or NaN, or infinite.
    NotFiniteNumber,
}

/// Parses a plain decimal integer within `[min, max]`.
///
/// Accepts an optional sign and leading zeros (`+3`, `07`, `-0`); refuses exponents, hex,
/// fractions and non-ASCII digits. Does not trim.
pub(crate) fn parse_integer(text: &str, min: i64, max: i64) -> Result<i64, ScalarError> {
    // `i64::from_str` accepts exactly an optional sign and ASCII digits.
    let value: i64 = text.parse().map_err(|_| {
        if looks_like_an_out_of_range_integer(text) {
            ScalarError::AboveMaximum
        } else {
            ScalarError::NotInteger
        }
    })?;
    if value < min {
        Err(ScalarError::BelowMinimum)
    } else if value > max {
        Err(ScalarError::AboveMaximum)
    } else {
        Ok(value)
    }
}

/// A well-formed integer too large for `i64` is "too large", not "not an integer".
fn looks_like_an_out_of_range_integer(text: &str) -> bool {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    !text.starts_with('-') && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Parses a strict boolean: `""`, `0`, `false` are false; `1`, `true` are true; any case.
///
/// Does not trim; callers trim first.
pub(crate) fn parse_bool(text: &str) -> Result<bool, ScalarError> {
    if text.is_empty() || text == "0" || text.eq_ignore_ascii_case("false") {
        Ok(false)
    } else if text == "1" || text.eq_ignore_ascii_case("true") {
        Ok(true)
    } else {
        Err(ScalarError::NotBoolean)
    }
}

/// Parses a finite, non-negative decimal number (`2`, `0.5`, `+1.25`, `1e1`).
///
/// Refuses NaN, infinities and negative values; `-0` is zero. Does not trim.
pub(crate) fn parse_non_negative_float(text: &str) -> Result<f64, ScalarError> {
    let value: f64 = text.parse().map_err(|_| ScalarError::NotFiniteNumber)?;
    if !value.is_finite() {
        return Err(ScalarError::NotFiniteNumber);
    }
    if value < 0.0 {
        return Err(ScalarError::BelowMinimum);
    }
    // Normalise `-0` to `0` so later `> 0` checks and logs are unsurprising.
    Ok(value.abs())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn integers_accept_sign_and_leading_zeros() {
        assert_eq!(parse_integer("+3", 0, 10), Ok(3));
        assert_eq!(parse_integer("07", 0, 10), Ok(7));
        assert_eq!(parse_integer("-0", 0, 10), Ok(0));
    }

    #[test]
    fn integers_refuse_exponent_hex_fraction_and_unicode_digits() {
        for bad in [
            "1e3", "0x10", "1.5", "\u{0663}", "\u{ff11}", "", "+", "-", "1_000", " 1",
        ] {
            assert_eq!(
                parse_integer(bad, 0, i64::MAX),
                Err(ScalarError::NotInteger),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn integers_outside_the_range_are_refused() {
        assert_eq!(parse_integer("-1", 0, 10), Err(ScalarError::BelowMinimum));
        assert_eq!(parse_integer("11", 0, 10), Err(ScalarError::AboveMaximum));
        assert_eq!(
            parse_integer("99999999999999999999999", 0, 10),
            Err(ScalarError::AboveMaximum)
        );
    }

    #[test]
    fn booleans_accept_only_the_four_spellings() {
        for (text, want) in [
            ("", false),
            ("0", false),
            ("false", false),
            ("FALSE", false),
            ("1", true),
            ("true", true),
            ("True", true),
        ] {
            assert_eq!(parse_bool(text), Ok(want), "{text:?}");
        }
        for bad in ["yes", "on", "2", "t", "01", "truee"] {
            assert_eq!(parse_bool(bad), Err(ScalarError::NotBoolean), "{bad:?}");
        }
    }

    #[test]
    fn floats_must_be_finite_and_non_negative() {
        assert_eq!(parse_non_negative_float("0.5"), Ok(0.5));
        assert_eq!(parse_non_negative_float("2"), Ok(2.0));
        assert_eq!(parse_non_negative_float("-0"), Ok(0.0));
        for bad in ["NaN", "nan", "inf", "-inf", "Infinity", "abc", ""] {
            assert_eq!(
                parse_non_negative_float(bad),
                Err(ScalarError::NotFiniteNumber),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_non_negative_float("-0.5"),
            Err(ScalarError::BelowMinimum)
        );
    }
}

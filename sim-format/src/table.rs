//! The parameter table: plimsolld writes it to the run's work directory, the worker reads it.
//!
//! One row a line, each ending in `\n`; values separated by one space, each written in
//! Rust's shortest round-trip form with an exponent (`{:e}`: `5e-1`, `-0e0`, `5e-324`,
//! `1.7976931348623157e308`), so the worker reads back exactly the bits the caller sent,
//! negative zero included. Every value must be finite.

/// Why a table was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// There is no row at all.
    #[error("the table has no rows")]
    Empty,
    /// More rows than a run may have.
    #[error("the table has more than {} rows", crate::MAX_ROWS)]
    TooManyRows,
    /// The text does not end with a newline (it was cut short).
    #[error("the table does not end with a newline")]
    Unterminated,
    /// A row has another number of values than the model takes.
    #[error("row {row} has {found} values; the model takes {expected}")]
    Width {
        row: usize,
        found: usize,
        expected: usize,
    },
    /// A value is not a finite number.
    #[error("row {row} value {column} is not a finite number")]
    Value { row: usize, column: usize },
}

/// The table for `rows`, as plimsolld writes it.
pub fn write<'a>(rows: impl IntoIterator<Item = &'a [f64]>) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    for row in rows {
        for (i, value) in row.iter().enumerate() {
            if i > 0 {
                text.push(' ');
            }
            // Writing to a String cannot fail.
            let _ = write!(text, "{value:e}");
        }
        text.push('\n');
    }
    text
}

/// The table's values, row-major, checked: 1 to [`MAX_ROWS`](crate::MAX_ROWS) rows of exactly
/// `width` finite values each.
pub fn parse(text: &str, width: usize) -> Result<Vec<f64>, TableError> {
    let Some(body) = text.strip_suffix('\n') else {
        return Err(if text.is_empty() {
            TableError::Empty
        } else {
            TableError::Unterminated
        });
    };
    let mut values = Vec::new();
    for (row, line) in body.split('\n').enumerate() {
        if row >= crate::MAX_ROWS {
            return Err(TableError::TooManyRows);
        }
        let mut found = 0;
        for (column, word) in line.split(' ').enumerate() {
            let value = word
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or(TableError::Value { row, column })?;
            found += 1;
            if found > width {
                break;
            }
            values.push(value);
        }
        if found != width {
            return Err(TableError::Width {
                row,
                found: line.split(' ').count(),
                expected: width,
            });
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_value_round_trips_bit_for_bit() {
        let row = [
            -0.0,
            0.0,
            5e-324,
            f64::MAX,
            f64::MIN_POSITIVE,
            1e21,
            0.1,
            -1.0 / 3.0,
        ];
        let text = write([row.as_slice()]);
        let back = parse(&text, row.len()).unwrap();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&row));
        assert_eq!(
            text,
            "-0e0 0e0 5e-324 1.7976931348623157e308 2.2250738585072014e-308 1e21 1e-1 -3.333333333333333e-1\n"
        );
    }

    #[test]
    fn malformed_tables_are_refused_with_where() {
        assert_eq!(parse("", 1), Err(TableError::Empty));
        assert_eq!(parse("1e0", 1), Err(TableError::Unterminated));
        assert_eq!(parse("\n", 1), Err(TableError::Value { row: 0, column: 0 }));
        assert_eq!(
            parse("1 2\n3\n", 2),
            Err(TableError::Width {
                row: 1,
                found: 1,
                expected: 2
            })
        );
        assert_eq!(
            parse("1 2 3\n", 2),
            Err(TableError::Width {
                row: 0,
                found: 3,
                expected: 2
            })
        );
        assert_eq!(
            parse("1  2\n", 2),
            Err(TableError::Value { row: 0, column: 1 })
        );
        assert_eq!(
            parse("NaN\n", 1),
            Err(TableError::Value { row: 0, column: 0 })
        );
        assert_eq!(
            parse("inf\n", 1),
            Err(TableError::Value { row: 0, column: 0 })
        );
        assert_eq!(
            parse("1e400\n", 1),
            Err(TableError::Value { row: 0, column: 0 })
        );
    }

    #[test]
    fn more_rows_than_a_run_may_have_are_refused() {
        let text = "1\n".repeat(crate::MAX_ROWS + 1);
        assert_eq!(parse(&text, 1), Err(TableError::TooManyRows));
        assert_eq!(
            parse(&"1\n".repeat(crate::MAX_ROWS), 1).unwrap().len(),
            crate::MAX_ROWS
        );
    }
}

//! Reading protojson request values the way Docker's services accept them: 64-bit
//! integers as numbers or decimal strings, repeated strings as JSON arrays.

use serde_json::Value;

/// An unsigned integer: a JSON number or a decimal string.
pub fn uint(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A list of strings (`None` when it is not one).
pub fn strings(value: &Value) -> Option<Vec<String>> {
    value
        .as_array()?
        .iter()
        .map(|item| item.as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn uint64_is_a_number_or_a_string() {
        assert_eq!(uint(&json!(7)), Some(7));
        assert_eq!(uint(&json!("2048")), Some(2048));
        assert_eq!(uint(&json!(-1)), None);
        assert_eq!(uint(&json!("x")), None);
    }

    #[test]
    fn strings_refuse_other_items() {
        assert_eq!(
            strings(&json!(["a", "b"])),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(strings(&json!(["a", 1])), None);
        assert_eq!(strings(&json!("a")), None);
    }
}

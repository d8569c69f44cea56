//! The guard's envelope (grants.md §5.5 step 7): the JSON object a guest posts to the guard,
//! `{"method": "...", "path": "...", "body": <any JSON>}`.
//!
//! Strict: the top level is an object with exactly these keys (`body` optional), no unknown
//! or repeated key, nothing after the value. `method` must not be blank and `path` must not be
//! empty; neither is judged further here, because the broker counts every call against the
//! run's budget before it judges the route (grants.md §2.2 step 3). `body` is kept as the raw
//! JSON text the guest sent, `null` included, and goes upstream byte for byte; an absent
//! `body` means an empty upstream body.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The largest envelope the guard reads (grants.md §5.5 step 6).
pub const MAX_ENVELOPE_BYTES: usize = 2 * 1024 * 1024;

/// A decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The call's method, as the guest wrote it.
    pub method: String,
    /// The call's target, as the guest wrote it.
    pub path: String,
    /// The raw JSON text of `body`, or empty when the envelope had none.
    pub body: Vec<u8>,
}

/// Why an envelope was refused (a 400 for the guest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Longer than [`MAX_ENVELOPE_BYTES`].
    #[error("the envelope is over {MAX_ENVELOPE_BYTES} bytes")]
    TooLarge,
    /// Not one JSON object of the envelope's shape.
    #[error("the envelope is not {{\"method\", \"path\", \"body\"?}}: {0}")]
    Shape(String),
    /// `method` is empty or only whitespace.
    #[error("the envelope's method is blank")]
    BlankMethod,
    /// `path` is empty.
    #[error("the envelope's path is empty")]
    EmptyPath,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire<'a> {
    method: String,
    path: String,
    // Present (even as `null`) is `Some`: the raw text goes upstream as sent.
    #[serde(default, borrow, deserialize_with = "present")]
    body: Option<&'a RawValue>,
}

fn present<'de, D>(value: D) -> Result<Option<&'de RawValue>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    <&RawValue>::deserialize(value).map(Some)
}

// === impl Envelope ===

impl Envelope {
    /// Decodes one envelope.
    pub fn decode(bytes: &[u8]) -> Result<Envelope, EnvelopeError> {
        if bytes.len() > MAX_ENVELOPE_BYTES {
            return Err(EnvelopeError::TooLarge);
        }
        let wire: Wire<'_> =
            serde_json::from_slice(bytes).map_err(|e| EnvelopeError::Shape(e.to_string()))?;
        if wire.method.trim().is_empty() {
            return Err(EnvelopeError::BlankMethod);
        }
        if wire.path.is_empty() {
            return Err(EnvelopeError::EmptyPath);
        }
        Ok(Envelope {
            method: wire.method,
            path: wire.path,
            body: wire
                .body
                .map(|raw| raw.get().as_bytes().to_vec())
                .unwrap_or_default(),
        })
    }

    /// The envelope as JSON that [`Envelope::decode`] reads back to an equal value.
    pub fn encode(&self) -> Vec<u8> {
        let method = serde_json::to_string(&self.method).unwrap_or_default();
        let path = serde_json::to_string(&self.path).unwrap_or_default();
        let mut out = format!(r#"{{"method":{method},"path":{path}"#).into_bytes();
        if !self.body.is_empty() {
            out.extend_from_slice(br#","body":"#);
            out.extend_from_slice(&self.body);
        }
        out.push(b'}');
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_body_goes_on_as_the_raw_text_sent() {
        let e = Envelope::decode(br#"{"method":"POST","path":"/items","body":{"a": [1, 2.50]}}"#)
            .unwrap();
        assert_eq!(e.method, "POST");
        assert_eq!(e.path, "/items");
        assert_eq!(e.body, br#"{"a": [1, 2.50]}"#);
        let null = Envelope::decode(br#"{"method":"PUT","path":"/x","body":null}"#).unwrap();
        assert_eq!(null.body, b"null");
        let none = Envelope::decode(br#"{"path":"/x","method":"GET"}"#).unwrap();
        assert!(none.body.is_empty());
        for e in [e, null, none] {
            assert_eq!(Envelope::decode(&e.encode()).unwrap(), e);
        }
    }

    #[test]
    fn anything_else_is_refused() {
        let refused = |text: &str| Envelope::decode(text.as_bytes()).unwrap_err();
        assert_eq!(
            refused(r#"{"method":" ","path":"/x"}"#),
            EnvelopeError::BlankMethod
        );
        assert_eq!(
            refused(r#"{"method":"GET","path":""}"#),
            EnvelopeError::EmptyPath
        );
        for text in [
            "",
            "[]",
            "null",
            r#"{"method":"GET"}"#,
            r#"{"path":"/x"}"#,
            r#"{"method":"GET","path":"/x","extra":1}"#,
            r#"{"method":"GET","path":"/x","method":"PUT"}"#,
            r#"{"method":"GET","path":"/x"} {}"#,
            r#"{"method":1,"path":"/x"}"#,
            r#"{"method":"GET","path":"/x","body":}"#,
        ] {
            assert!(
                matches!(refused(text), EnvelopeError::Shape(_)),
                "{text}: {:?}",
                Envelope::decode(text.as_bytes())
            );
        }
        let huge = vec![b' '; MAX_ENVELOPE_BYTES + 1];
        assert_eq!(
            Envelope::decode(&huge).unwrap_err(),
            EnvelopeError::TooLarge
        );
    }
}

//! Signed run records, outside the daemon (`records.md` §9): Ed25519 keys, DSSE envelopes
//! holding in-toto statements, and a JSON Lines bundle per session.
//!
//! The daemon holds no key; records are digests and a chain. A harness that wants signed
//! evidence signs what it received, after the client checked it:
//!
//! - [`keygen`]: an Ed25519 key pair as PEM, the private key PKCS#8 (`PRIVATE KEY`), the
//!   public key SPKI (`PUBLIC KEY`). Its key id is the lowercase hex SHA-256 of the public
//!   key's DER ([`key_id`]).
//! - [`sign_record`] / [`verify_envelope`]: a DSSE envelope (`payloadType`
//!   `application/vnd.in-toto+json`) over an in-toto Statement v1 whose subject is the
//!   record's digest and whose predicate is the record ([`record_predicate`]).
//! - [`sign_session`] / [`verify_bundle`]: a session's calls as JSON Lines — per call the
//!   binary request (without the session id) and response, or an unanswered call's record
//!   (base64), the envelope and a link to the previous line — then a signed checkpoint of the
//!   session's close totals and what it stated at open. Verification re-checks every record
//!   against its request and response, the chain from call 1, every signature, every link
//!   and the checkpoint, so a dropped or reordered call, or one changed byte, fails.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use buffa::Message as _;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer as _, Verifier as _};
/// The key types [`signing_key`] and [`verifying_key`] read.
pub use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::client::{Opened, RunAnswer, SessionAnswer, SessionState, verify_chain, verify_session};
use crate::wire::{RunRecord, SessionRunRequest, SessionRunResponse};

/// The DSSE payload type of every envelope.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The in-toto statement type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The predicate type of a run record.
pub const RUN_RECORD_PREDICATE: &str = "https://plimsollmark.github.io/plimsoll/run-record/v1";
/// The predicate type of a session's close checkpoint.
pub const SESSION_CLOSE_PREDICATE: &str =
    "https://plimsollmark.github.io/plimsoll/session-close/v1";

/// Why signing or verification failed.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    /// A key could not be read or written as PEM.
    #[error("key: {0}")]
    Key(String),
    /// The envelope or bundle is not well formed.
    #[error("malformed: {0}")]
    Malformed(String),
    /// A signature does not verify, or is by another key.
    #[error("signature: {0}")]
    Signature(String),
    /// The signed statement does not match the evidence beside it.
    #[error("statement: {0}")]
    Statement(String),
    /// A record, the chain or a link does not check.
    #[error("evidence: {0}")]
    Evidence(String),
}

/// A DSSE envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Always [`PAYLOAD_TYPE`].
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// The statement's JSON, standard padded base64.
    pub payload: String,
    /// One signature per key.
    pub signatures: Vec<EnvelopeSignature>,
}

/// One signature of an envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvelopeSignature {
    /// [`key_id`] of the signing key.
    pub keyid: String,
    /// The Ed25519 signature over the PAE, standard padded base64.
    pub sig: String,
}

/// A fresh Ed25519 key pair: (PKCS#8 private PEM, SPKI public PEM).
pub fn keygen() -> Result<(String, String), AttestError> {
    let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let private = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| AttestError::Key(e.to_string()))?;
    let public = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| AttestError::Key(e.to_string()))?;
    Ok((private.to_string(), public))
}

/// Reads a PKCS#8 `PRIVATE KEY` PEM.
pub fn signing_key(pem: &str) -> Result<SigningKey, AttestError> {
    SigningKey::from_pkcs8_pem(pem).map_err(|e| AttestError::Key(e.to_string()))
}

/// Reads an SPKI `PUBLIC KEY` PEM.
pub fn verifying_key(pem: &str) -> Result<VerifyingKey, AttestError> {
    VerifyingKey::from_public_key_pem(pem).map_err(|e| AttestError::Key(e.to_string()))
}

/// The key id: lowercase hex SHA-256 of the public key's SPKI DER.
pub fn key_id(key: &VerifyingKey) -> Result<String, AttestError> {
    let der = key
        .to_public_key_der()
        .map_err(|e| AttestError::Key(e.to_string()))?;
    Ok(hex::encode(Sha256::digest(der.as_bytes())))
}

/// DSSE's pre-authentication encoding of `payload`.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The statement predicate of a record: its fields with snake_case names, the `software_*`
/// fields, `instance` and `unanswered` left out when empty.
pub fn record_predicate(r: &RunRecord) -> Value {
    let mut p = json!({
        "version": r.version,
        "request_sha256": r.request_sha256,
        "result_sha256": r.result_sha256,
        "provider": r.provider,
        "isolation": r.isolation,
        "environment": r.environment,
        "policy": r.policy,
        "started_unix_ms": r.started_unix_ms,
        "ended_unix_ms": r.ended_unix_ms,
        "session": r.session,
        "sequence": r.sequence,
        "previous_sha256": r.previous_sha256,
        "record_sha256": r.record_sha256,
    });
    for (name, value) in [
        ("software_identity", &r.software_identity),
        ("software_rule_id", &r.software_rule_id),
        ("instance", &r.instance),
        ("unanswered", &r.unanswered),
    ] {
        if !value.is_empty() {
            p[name] = json!(value);
        }
    }
    p
}

fn statement(subject: &str, digest: &str, predicate_type: &str, predicate: Value) -> Value {
    json!({
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject, "digest": {"sha256": digest}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    })
}

fn sign_statement(key: &SigningKey, st: &Value) -> Result<Envelope, AttestError> {
    let payload = serde_json::to_vec(st).map_err(|e| AttestError::Malformed(e.to_string()))?;
    let sig = key.sign(&pae(PAYLOAD_TYPE, &payload));
    Ok(Envelope {
        payload_type: PAYLOAD_TYPE.to_owned(),
        payload: STANDARD.encode(&payload),
        signatures: vec![EnvelopeSignature {
            keyid: key_id(&key.verifying_key())?,
            sig: STANDARD.encode(sig.to_bytes()),
        }],
    })
}

/// Signs a run record: an envelope whose statement names `run-record` with the record's
/// digest and carries [`record_predicate`].
pub fn sign_record(key: &SigningKey, record: &RunRecord) -> Result<Envelope, AttestError> {
    let st = statement(
        "run-record",
        &record.record_sha256,
        RUN_RECORD_PREDICATE,
        record_predicate(record),
    );
    sign_statement(key, &st)
}

/// Verifies an envelope's signature by `key` and returns its statement.
pub fn verify_envelope(key: &VerifyingKey, env: &Envelope) -> Result<Value, AttestError> {
    if env.payload_type != PAYLOAD_TYPE {
        return Err(AttestError::Malformed(format!(
            "payload type {:?}",
            env.payload_type
        )));
    }
    let payload = STANDARD
        .decode(&env.payload)
        .map_err(|e| AttestError::Malformed(format!("payload base64: {e}")))?;
    let id = key_id(key)?;
    let sig = env
        .signatures
        .iter()
        .find(|s| s.keyid == id)
        .ok_or_else(|| AttestError::Signature("no signature by this key".to_owned()))?;
    let raw = STANDARD
        .decode(&sig.sig)
        .map_err(|e| AttestError::Malformed(format!("signature base64: {e}")))?;
    let sig = Signature::from_slice(&raw).map_err(|e| AttestError::Signature(e.to_string()))?;
    key.verify(&pae(PAYLOAD_TYPE, &payload), &sig)
        .map_err(|_| AttestError::Signature("the signature does not verify".to_owned()))?;
    let st: Value = serde_json::from_slice(&payload)
        .map_err(|e| AttestError::Malformed(format!("statement: {e}")))?;
    if st["_type"] != STATEMENT_TYPE {
        return Err(AttestError::Malformed(
            "not an in-toto Statement v1".to_owned(),
        ));
    }
    Ok(st)
}

/// Checks that a verified statement is about `record`: subject digest and predicate.
pub fn statement_matches(st: &Value, record: &RunRecord) -> Result<(), AttestError> {
    if st["predicateType"] != RUN_RECORD_PREDICATE
        || st["subject"][0]["digest"]["sha256"] != record.record_sha256.as_str()
        || st["predicate"] != record_predicate(record)
    {
        return Err(AttestError::Statement(format!(
            "the signed statement is not about record {}",
            record.record_sha256
        )));
    }
    Ok(())
}

/// Re-checks a saved single-run answer, then checks that `env` is a valid signature by
/// `key` over its record.
pub fn verify_answer(
    key: &VerifyingKey,
    env: &Envelope,
    answer: &RunAnswer,
) -> Result<(), AttestError> {
    let record = answer
        .verify()
        .map_err(|e| AttestError::Evidence(e.to_string()))?;
    let st = verify_envelope(key, env)?;
    statement_matches(&st, record)
}

#[derive(Serialize, Deserialize)]
struct CallLine {
    request: String,
    /// Empty for an unanswered call.
    response: String,
    envelope: Envelope,
    link: Link,
    /// An unanswered call's record, binary protobuf in base64 (absent on answered calls).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    unanswered: String,
}

#[derive(Serialize, Deserialize)]
struct Link {
    sequence: u64,
    previous_line_sha256: String,
}

#[derive(Serialize, Deserialize, PartialEq)]
struct Checkpoint {
    session: String,
    calls: u64,
    last_record_sha256: String,
    previous_line_sha256: String,
    /// What the session stated at open, against which unanswered calls' records are
    /// checked (they have no answer of their own).
    #[serde(flatten)]
    opened: OpenedEvidence,
}

#[derive(Serialize, Deserialize, PartialEq, Default)]
struct OpenedEvidence {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    provider: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    isolation: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    software_identity: String,
}

#[derive(Serialize, Deserialize)]
struct CheckpointLine {
    checkpoint: Checkpoint,
    envelope: Envelope,
}

/// Signs a saved session's calls into a JSON Lines bundle. The session is re-checked
/// first, whole ([`verify_session`]: the chain from call 1, and the state's own totals);
/// unchecked evidence is never signed. An unanswered call is signed by its record.
pub fn sign_session(
    key: &SigningKey,
    state: &SessionState,
    answers: &[SessionAnswer],
) -> Result<String, AttestError> {
    let (calls, last) =
        verify_session(state, answers).map_err(|e| AttestError::Evidence(e.to_string()))?;
    let mut out = String::new();
    let mut previous = String::new();
    for (n, a) in answers.iter().enumerate() {
        let record = a
            .record()
            .ok_or_else(|| AttestError::Evidence("a call without a record".to_owned()))?;
        let (response, unanswered) = match &a.unanswered {
            Some(rec) => (String::new(), STANDARD.encode(rec.encode_to_vec())),
            None => (STANDARD.encode(a.response.encode_to_vec()), String::new()),
        };
        // A bundle is evidence handed to others: the session id, a capability, is left out
        // (the request's digest never covers it, records.md §4.2).
        let mut request = a.request.clone();
        request.session_id.clear();
        let line = CallLine {
            request: STANDARD.encode(request.encode_to_vec()),
            response,
            envelope: sign_record(key, record)?,
            link: Link {
                sequence: n as u64 + 1,
                previous_line_sha256: previous.clone(),
            },
            unanswered,
        };
        let text =
            serde_json::to_string(&line).map_err(|e| AttestError::Malformed(e.to_string()))?;
        previous = hex::encode(Sha256::digest(text.as_bytes()));
        out.push_str(&text);
        out.push('\n');
    }
    let checkpoint = Checkpoint {
        session: state.fingerprint.clone(),
        calls,
        last_record_sha256: last,
        previous_line_sha256: previous,
        opened: OpenedEvidence {
            provider: state.provider.clone(),
            isolation: state.isolation.clone(),
            software_identity: state.software_identity.clone(),
        },
    };
    let predicate =
        serde_json::to_value(&checkpoint).map_err(|e| AttestError::Malformed(e.to_string()))?;
    let st = statement(
        "session",
        &state.fingerprint,
        SESSION_CLOSE_PREDICATE,
        predicate,
    );
    let line = CheckpointLine {
        envelope: sign_statement(key, &st)?,
        checkpoint,
    };
    out.push_str(&serde_json::to_string(&line).map_err(|e| AttestError::Malformed(e.to_string()))?);
    out.push('\n');
    Ok(out)
}

/// Verifies a session bundle whole: every line's signature and statement, every record
/// against its request and response (an unanswered call's against its request and what the
/// session stated at open), the chain from call 1, the links, and the signed checkpoint at
/// the end. Returns the number of calls and the last record digest.
pub fn verify_bundle(key: &VerifyingKey, text: &str) -> Result<(u64, String), AttestError> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let Some((last_line, call_lines)) = lines.split_last() else {
        return Err(AttestError::Malformed("an empty bundle".to_owned()));
    };
    let mut answers = Vec::with_capacity(call_lines.len());
    let mut previous = String::new();
    for (n, raw) in call_lines.iter().enumerate() {
        let line: CallLine = serde_json::from_str(raw)
            .map_err(|e| AttestError::Malformed(format!("line {}: {e}", n + 1)))?;
        if line.link.sequence != n as u64 + 1 || line.link.previous_line_sha256 != previous {
            return Err(AttestError::Evidence(format!(
                "line {}: its link does not follow the line before it",
                n + 1
            )));
        }
        let request = decode::<SessionRunRequest>(&line.request, n)?;
        let answer = if line.unanswered.is_empty() {
            SessionAnswer {
                request,
                response: decode::<SessionRunResponse>(&line.response, n)?,
                unanswered: None,
            }
        } else if line.response.is_empty() {
            SessionAnswer {
                request,
                response: SessionRunResponse::default(),
                unanswered: Some(decode::<RunRecord>(&line.unanswered, n)?),
            }
        } else {
            return Err(AttestError::Malformed(format!(
                "line {}: both an answer and an unanswered record",
                n + 1
            )));
        };
        let record = answer
            .record()
            .ok_or_else(|| AttestError::Evidence(format!("line {}: no record", n + 1)))?;
        let st = verify_envelope(key, &line.envelope)?;
        statement_matches(&st, record)?;
        answers.push(answer);
        previous = hex::encode(Sha256::digest(raw.as_bytes()));
    }
    let end: CheckpointLine = serde_json::from_str(last_line)
        .map_err(|e| AttestError::Malformed(format!("checkpoint: {e}")))?;
    let st = verify_envelope(key, &end.envelope)?;
    let predicate =
        serde_json::to_value(&end.checkpoint).map_err(|e| AttestError::Malformed(e.to_string()))?;
    if st["predicateType"] != SESSION_CLOSE_PREDICATE || st["predicate"] != predicate {
        return Err(AttestError::Statement(
            "the signed checkpoint is not the one in the bundle".to_owned(),
        ));
    }
    let cp = &end.checkpoint;
    let opened = Opened {
        fingerprint: &cp.session,
        provider: &cp.opened.provider,
        isolation: &cp.opened.isolation,
        software_identity: &cp.opened.software_identity,
    };
    let (calls, last) =
        verify_chain(opened, &answers).map_err(|e| AttestError::Evidence(e.to_string()))?;
    if cp.previous_line_sha256 != previous || cp.calls != calls || cp.last_record_sha256 != last {
        return Err(AttestError::Evidence(format!(
            "the checkpoint states {} calls ending {:?}, the bundle holds {calls} ending {last:?}",
            cp.calls, cp.last_record_sha256
        )));
    }
    Ok((calls, last))
}

fn decode<M: buffa::Message>(b64: &str, n: usize) -> Result<M, AttestError> {
    let raw = STANDARD
        .decode(b64)
        .map_err(|e| AttestError::Malformed(format!("line {}: base64: {e}", n + 1)))?;
    M::decode_from_slice(&raw)
        .map_err(|e| AttestError::Malformed(format!("line {}: protobuf: {e}", n + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_matches_the_dsse_definition() {
        assert_eq!(pae("t", b"ab"), b"DSSEv1 1 t 2 ab".to_vec());
    }

    #[test]
    fn keys_round_trip_and_signatures_verify() {
        let (private, public) = keygen().unwrap_or_else(|e| panic!("{e}"));
        assert!(private.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"));
        let sk = signing_key(&private).unwrap_or_else(|e| panic!("{e}"));
        let vk = verifying_key(&public).unwrap_or_else(|e| panic!("{e}"));
        let record = RunRecord {
            version: 4,
            record_sha256: "ab".repeat(32),
            ..Default::default()
        };
        let env = sign_record(&sk, &record).unwrap_or_else(|e| panic!("{e}"));
        let st = verify_envelope(&vk, &env).unwrap_or_else(|e| panic!("{e}"));
        assert!(statement_matches(&st, &record).is_ok());
        assert!(st["predicate"].get("software_identity").is_none());

        let mut forged = env.clone();
        let mut payload = STANDARD.decode(&forged.payload).unwrap_or_default();
        payload[10] ^= 1;
        forged.payload = STANDARD.encode(payload);
        assert!(matches!(
            verify_envelope(&vk, &forged),
            Err(AttestError::Signature(_))
        ));

        let other = RunRecord {
            record_sha256: "cd".repeat(32),
            ..record
        };
        assert!(statement_matches(&st, &other).is_err());
    }
}

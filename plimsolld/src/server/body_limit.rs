//! Layer 5: a declared body over 8 MiB is refused from its header alone,
//! without reading a byte of it (`resource_exhausted`, `NotDispatched{request}`).
//!
//! A chunked body is cut at 8 MiB, and the decoded (decompressed) message
//! capped at 8 MiB, by the Connect service's own limits, set in
//! [`super::Pipeline::build`].

use plimsoll::refusal::Refusal;
use plimsoll::validate::MAX_MESSAGE_BYTES;

use super::exchange::Exchange;
use super::{HttpRequest, Inner, ResponseFuture, Step, answer, pass, refuse};

/// The body-limit step.
#[derive(Clone)]
pub struct BodyLimit;

/// The declared length, when it is over the cap. An unparseable length is
/// left to hyper, which refuses it before this layer runs.
fn declared_over_cap(req: &HttpRequest) -> Option<u64> {
    let len: u64 = req
        .headers()
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (len > MAX_MESSAGE_BYTES as u64).then_some(len)
}

impl Step for BodyLimit {
    fn handle<S: Inner>(&self, req: HttpRequest, next: S) -> ResponseFuture {
        if let Some(len) = declared_over_cap(&req) {
            return answer(refuse(
                req.headers(),
                &Exchange::of(req.extensions()),
                Refusal::BodyTooLarge(format!(
                    "request body of {len} bytes is over the {MAX_MESSAGE_BYTES} byte limit; nothing ran"
                )),
            ));
        }
        pass(next, req)
    }
}

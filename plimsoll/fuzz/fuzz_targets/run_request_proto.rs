//! Arbitrary bytes as a binary protobuf `RunRequest` and `SessionRunRequest`, the way a
//! Connect or gRPC proto body reaches the daemon: decode with buffa, then the validation steps
//! of wire.md §6.1 and the request digest.
//!
//! Beyond "nothing panics", a request that decoded must re-encode and decode to the same
//! verdict and the same digest: the client digests the message it encodes, the daemon the
//! message it decodes.
#![no_main]

use buffa::Message;
use libfuzzer_sys::fuzz_target;
use plimsoll::wire::{RunRequest, SessionRunRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = RunRequest::decode(&mut &data[..]) {
        let first = plimsoll_fuzz::run_request(&req);
        let again = RunRequest::decode_from_slice(&req.encode_to_vec())
            .expect("a decoded RunRequest re-encodes to protobuf that decodes");
        assert_eq!(
            plimsoll_fuzz::run_request(&again),
            first,
            "the RunRequest round trip changed the verdict or the digest"
        );
    }
    if let Ok(req) = SessionRunRequest::decode(&mut &data[..]) {
        let first = plimsoll_fuzz::session_run_request(&req);
        let again = SessionRunRequest::decode_from_slice(&req.encode_to_vec())
            .expect("a decoded SessionRunRequest re-encodes to protobuf that decodes");
        assert_eq!(
            plimsoll_fuzz::session_run_request(&again),
            first,
            "the SessionRunRequest round trip changed the verdict or the digest"
        );
    }
});

//! Arbitrary bytes as a proto3 JSON `RunRequest`, the way a Connect JSON body reaches the
//! daemon: decode, then the validation steps of wire.md §6.1 and the request digest.
//!
//! Beyond "nothing panics", a request that decoded must survive the trip to the binary
//! encoding and to JSON again with the same verdict and the same digest, since a client may
//! digest what it sends in either encoding.
#![no_main]

use buffa::Message;
use libfuzzer_sys::fuzz_target;
use plimsoll::wire::RunRequest;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = serde_json::from_slice::<RunRequest>(data) else {
        return;
    };
    let (verdict, digest) = plimsoll_fuzz::run_request(&req);

    let binary = RunRequest::decode_from_slice(&req.encode_to_vec())
        .expect("a decoded RunRequest re-encodes to protobuf that decodes");
    assert_eq!(
        plimsoll_fuzz::run_request(&binary),
        (verdict.clone(), digest.clone()),
        "the binary round trip changed the verdict or the digest"
    );

    let json = serde_json::to_vec(&req).expect("a decoded RunRequest serializes to JSON");
    let again = serde_json::from_slice::<RunRequest>(&json)
        .expect("the JSON the library writes decodes again");
    assert_eq!(
        plimsoll_fuzz::run_request(&again),
        (verdict, digest),
        "the JSON round trip changed the verdict or the digest"
    );
});

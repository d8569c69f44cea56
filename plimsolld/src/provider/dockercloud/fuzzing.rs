//! Entry points for the cargo-fuzz targets in `plimsolld/fuzz` (feature `fuzzing`): the
//! parsers of a sandbox endpoint's file answers, which carry whatever the code in the sandbox
//! wrote. Each function must return without panicking, whatever it is given.

use super::{api, rest_endpoint};

/// The file service's answer to a Connect stream call (`Download`'s carries a file): its
/// envelopes, read up to the end-of-stream envelope that must close it.
pub fn connect_stream(body: &[u8]) {
    let _ = api::messages("Download", body);
}

/// A REST download's multipart/mixed answer, under the `boundary` its Content-Type named.
/// A part that is read ends at the first delimiter after it: none is inside it.
pub fn multipart(body: &[u8], boundary: &str) {
    let Ok(parts) = rest_endpoint::parts(body, boundary) else {
        return;
    };
    let delimiter = format!("\r\n--{boundary}");
    for (name, bytes) in parts {
        assert!(
            !bytes
                .windows(delimiter.len())
                .any(|w| w == delimiter.as_bytes()),
            "part {name:?} holds a delimiter"
        );
    }
}

//! `__coderunner_host_call(envelope)`: the guest's one way out (grants.md §3, wasm row).
//!
//! The function is always defined. It hands the envelope (a JSON string `{method, path,
//! body?}`) to the host import `coderunner.host_call` (a frozen ABI) together with a
//! response buffer in guest memory, and returns `{status, body}`. Whether anything is
//! contacted is the host's decision: without a grant the host answers an error status and
//! calls nobody. The credential never crosses guest memory; only the envelope and the
//! response body do.
//!
//! The client library the host prepends for a granted run (`globalThis.host`) is built on
//! this function; see `plimsolld/src/grant/host_client.js`.

use rquickjs::{Ctx, Function, Object};

/// The response buffer the guest offers the host for each call.
const RESPONSE_CAP: usize = 4 * 1024 * 1024;

#[link(wasm_import_module = "coderunner")]
unsafe extern "C" {
    /// Sends `req_len` bytes at `req_ptr`; the host writes at most `resp_cap` bytes of
    /// response body at `resp_ptr` and returns the status in the high 32 bits and the body
    /// length in the low 32 bits.
    #[link_name = "host_call"]
    fn host_call(req_ptr: *const u8, req_len: usize, resp_ptr: *mut u8, resp_cap: usize) -> i64;
}

/// Defines `__coderunner_host_call` on the global object.
pub fn install<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<()> {
    let call = Function::new(ctx.clone(), |ctx: Ctx<'js>, envelope: String| {
        let (status, body) = relay(envelope.as_bytes());
        let answer = Object::new(ctx.clone())?;
        answer.set("status", status)?;
        answer.set("body", String::from_utf8_lossy(&body).into_owned())?;
        Ok::<Object<'js>, rquickjs::Error>(answer)
    })?;
    ctx.globals().set("__coderunner_host_call", call)
}

/// One call through the host import: the status and the body the host wrote.
fn relay(envelope: &[u8]) -> (u32, Vec<u8>) {
    let mut response = vec![0u8; RESPONSE_CAP];
    // SAFETY: both pointers point into live allocations owned by this frame, with the
    // lengths passed beside them; the host writes only inside `response[..RESPONSE_CAP]`
    // and the call is synchronous, so nothing else touches either buffer meanwhile.
    let packed = unsafe {
        host_call(
            envelope.as_ptr(),
            envelope.len(),
            response.as_mut_ptr(),
            response.len(),
        )
    };
    let status = (packed as u64 >> 32) as u32;
    let length = (packed as u64 & 0xffff_ffff) as usize;
    // A length past the buffer cannot come from a well-behaved host; show nothing then.
    response.truncate(if length <= RESPONSE_CAP { length } else { 0 });
    (status, response)
}

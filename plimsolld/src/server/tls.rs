//! TLS for every listener when `PLIMSOLL_TLS_CERT` and `PLIMSOLL_TLS_KEY` are
//! set: rustls, TLS 1.2 minimum, ALPN `h2` then `http/1.1`, no client
//! certificates. The guard's listener loads its pair the same way, so the
//! loading is the guard crate's, shared.

pub use guard::tls::{TlsError, acceptor};

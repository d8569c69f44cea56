//! The daemon's base URL, checked once when the client is built.

use std::net::IpAddr;

use super::error::{ClientError, Failure};

/// Where the daemon is: scheme, host, port and an optional path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) https: bool,
    /// The host, without brackets for an IPv6 literal.
    pub(crate) host: String,
    pub(crate) port: u16,
    /// `host:port` as the `Host` header and `:authority` carry it.
    pub(crate) authority: String,
    /// The URL's path without its trailing `/`; `""` for none.
    pub(crate) prefix: String,
}

fn bad_url(message: &str) -> ClientError {
    ClientError::InvalidBaseUrl(Box::new(Failure::new(
        "invalid_argument",
        format!("plimsoll: {message}"),
    )))
}

/// Whether `host` is loopback: `localhost`, 127.0.0.0/8 or `::1`.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Endpoint {
    /// Parses and checks `raw`: an absolute http or https URL with a host, ASCII, without
    /// whitespace, userinfo, query or fragment; cleartext only to loopback unless
    /// `insecure_http`.
    pub(crate) fn parse(raw: &str, insecure_http: bool) -> Result<Endpoint, ClientError> {
        if raw.is_empty() || raw != raw.trim() {
            return Err(bad_url(
                "base URL must be non-empty and contain no surrounding whitespace",
            ));
        }
        if !raw.is_ascii() {
            return Err(bad_url("base URL must be ASCII (percent-encode the rest)"));
        }
        if raw
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(bad_url(
                "base URL must not contain whitespace or control characters",
            ));
        }
        if raw.contains(['?', '#']) {
            return Err(bad_url(
                "userinfo, query, and fragment are not permitted in the base URL",
            ));
        }
        let uri: http::Uri = raw
            .parse()
            .map_err(|_| bad_url("base URL must be an absolute HTTP or HTTPS URL"))?;
        let https = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
            Some("https") => true,
            Some("http") => false,
            Some(_) => return Err(bad_url("base URL scheme must be http or https")),
            None => return Err(bad_url("base URL must be an absolute HTTP or HTTPS URL")),
        };
        let Some(authority) = uri.authority() else {
            return Err(bad_url("base URL must be an absolute HTTP or HTTPS URL"));
        };
        if authority.as_str().contains('@') {
            return Err(bad_url(
                "userinfo, query, and fragment are not permitted in the base URL",
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(bad_url("base URL must name a host"));
        }
        if !https && !is_loopback(host) && !insecure_http {
            return Err(ClientError::InsecureHttp(Box::new(Failure::new(
                "invalid_argument",
                "plimsoll: cleartext HTTP to a non-loopback plimsoll requires the insecure-http opt-in",
            ))));
        }
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        Ok(Endpoint {
            https,
            host: host.to_owned(),
            port,
            authority: authority.as_str().to_owned(),
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    pub(crate) fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_http_is_accepted_with_its_prefix() {
        let e =
            Endpoint::parse("http://127.0.0.1:8746/api/", false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.host, "127.0.0.1");
        assert_eq!(e.port, 8746);
        assert_eq!(e.prefix, "/api");
        assert!(!e.https);
    }

    #[test]
    fn cleartext_to_a_remote_host_needs_the_opt_in() {
        assert!(matches!(
            Endpoint::parse("http://example.com", false),
            Err(ClientError::InsecureHttp(_))
        ));
        assert!(Endpoint::parse("http://example.com", true).is_ok());
        assert!(Endpoint::parse("https://example.com", false).is_ok());
    }

    #[test]
    fn userinfo_query_fragment_and_other_schemes_are_refused() {
        for raw in [
            "http://u:p@127.0.0.1",
            "http://127.0.0.1/?x=1",
            "http://127.0.0.1/#f",
            "ftp://127.0.0.1",
            "127.0.0.1:8746",
            " http://127.0.0.1",
        ] {
            assert!(
                matches!(
                    Endpoint::parse(raw, false),
                    Err(ClientError::InvalidBaseUrl(_))
                ),
                "{raw}"
            );
        }
    }

    #[test]
    fn ipv6_loopback_is_loopback() {
        let e = Endpoint::parse("http://[::1]:9000", false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.host, "::1");
        assert_eq!(e.authority, "[::1]:9000");
    }
}

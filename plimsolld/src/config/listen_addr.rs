//! `host:port` listener addresses, as Go's `net.SplitHostPort` reads them.
//!
//! An empty host (`:8746`) means every interface. IPv6 hosts are bracketed (`[::1]:8746`).
//! The port is a decimal number in `0..=65535`; `0` asks the kernel for a free port.

use std::net::IpAddr;

/// A listener address split into host and port.
///
/// Does not resolve names and does not bind; the server does both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// The host without brackets; empty means every interface.
    pub host: String,
    /// The port; `0` means "any free port".
    pub port: u16,
}

/// Why an address text is not `host:port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostPortError {
    /// No `:` separating host and port (a bare `9464` or `127.0.0.1`).
    #[error("missing port")]
    MissingPort,
    /// More than one `:` outside brackets (an IPv6 address must be bracketed).
    #[error("too many colons (bracket IPv6 hosts: [::1]:port)")]
    TooManyColons,
    /// A `[` without its `]`, or text between `]` and `:`.
    #[error("malformed brackets")]
    MalformedBrackets,
    /// The host holds characters no host name or IP address has.
    #[error("invalid host")]
    InvalidHost,
    /// The port is empty, not decimal, or above 65535.
    #[error("port must be a number in 0..=65535")]
    InvalidPort,
}

impl HostPort {
    /// Splits `host:port`. Does not trim: a space anywhere makes the host invalid.
    pub fn parse(text: &str) -> Result<Self, HostPortError> {
        let (host, port) = if let Some(after_bracket) = text.strip_prefix('[') {
            let close = after_bracket
                .find(']')
                .ok_or(HostPortError::MalformedBrackets)?;
            let host = &after_bracket[..close];
            let rest = &after_bracket[close + 1..];
            let port = rest.strip_prefix(':').ok_or(if rest.is_empty() {
                HostPortError::MissingPort
            } else {
                HostPortError::MalformedBrackets
            })?;
            if host.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(HostPortError::InvalidHost);
            }
            (host, port)
        } else {
            let colon = text.rfind(':').ok_or(HostPortError::MissingPort)?;
            let host = &text[..colon];
            if host.contains(':') {
                return Err(HostPortError::TooManyColons);
            }
            if host.contains(['[', ']']) || !host.chars().all(is_host_char) {
                return Err(HostPortError::InvalidHost);
            }
            (host, &text[colon + 1..])
        };
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(HostPortError::InvalidPort);
        }
        let port = port.parse().map_err(|_| HostPortError::InvalidPort)?;
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }

    /// True when the host is `localhost` (any case) or a loopback IP (`127.0.0.0/8`, `::1`,
    /// or `::ffff:127.x.y.z`). An empty host (every interface) and `0.0.0.0` are not loopback.
    pub fn is_loopback(&self) -> bool {
        if self.host.eq_ignore_ascii_case("localhost") {
            return true;
        }
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) => ip.is_loopback(),
            Ok(IpAddr::V6(ip)) => {
                ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
            Err(_) => false,
        }
    }
}

/// Whether `text` names a loopback listener. A value that does not parse as `host:port`
/// (including one without a port) is treated as not loopback: hardened mode fails closed.
pub fn is_loopback_addr(text: &str) -> bool {
    HostPort::parse(text).is_ok_and(|hp| hp.is_loopback())
}

/// Characters of a DNS name or an IPv4 address (IPv6 arrives bracketed).
fn is_host_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn hp(host: &str, port: u16) -> HostPort {
        HostPort {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn host_and_port_split_like_go() {
        assert_eq!(HostPort::parse("127.0.0.1:8746"), Ok(hp("127.0.0.1", 8746)));
        assert_eq!(HostPort::parse(":8746"), Ok(hp("", 8746)));
        assert_eq!(HostPort::parse(":0"), Ok(hp("", 0)));
        assert_eq!(HostPort::parse("[::1]:9464"), Ok(hp("::1", 9464)));
        assert_eq!(
            HostPort::parse("example.com:443"),
            Ok(hp("example.com", 443))
        );
    }

    #[test]
    fn values_without_a_port_are_refused() {
        assert_eq!(HostPort::parse("9464"), Err(HostPortError::MissingPort));
        assert_eq!(
            HostPort::parse("127.0.0.1"),
            Err(HostPortError::MissingPort)
        );
        assert_eq!(HostPort::parse("[::1]"), Err(HostPortError::MissingPort));
        assert_eq!(
            HostPort::parse("127.0.0.1:"),
            Err(HostPortError::InvalidPort)
        );
    }

    #[test]
    fn malformed_addresses_are_refused() {
        assert_eq!(HostPort::parse("::1:80"), Err(HostPortError::TooManyColons));
        assert_eq!(
            HostPort::parse("[::1:80"),
            Err(HostPortError::MalformedBrackets)
        );
        assert_eq!(
            HostPort::parse("[::1]x:80"),
            Err(HostPortError::MalformedBrackets)
        );
        assert_eq!(
            HostPort::parse("[nope]:80"),
            Err(HostPortError::InvalidHost)
        );
        assert_eq!(
            HostPort::parse(" 127.0.0.1:80"),
            Err(HostPortError::InvalidHost)
        );
        assert_eq!(HostPort::parse("h:65536"), Err(HostPortError::InvalidPort));
        assert_eq!(HostPort::parse("h:+80"), Err(HostPortError::InvalidPort));
        assert_eq!(HostPort::parse("h:http"), Err(HostPortError::InvalidPort));
    }

    #[test]
    fn loopback_is_localhost_or_a_loopback_ip() {
        for yes in [
            "localhost:1",
            "LOCALHOST:1",
            "127.0.0.1:1",
            "127.1.2.3:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(is_loopback_addr(yes), "{yes}");
        }
        for no in [
            ":8746",
            "0.0.0.0:8746",
            "[::]:8746",
            "10.0.0.1:1",
            "example.com:1",
            "127.0.0.1",
            "localhost",
        ] {
            assert!(!is_loopback_addr(no), "{no}");
        }
    }
}

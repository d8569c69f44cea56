//! Route patterns (`"METHOD /path"`) and how a request target matches them
//! (`spec/grants.md` §1.3 and §2.2 step 4).
//!
//! What is approved is what goes on the wire: a target is matched as the raw bytes the
//! guest sent, and only targets that need no percent-encoding, decoding or cleaning at all
//! are ever matched, so no HTTP library or upstream can read them differently.

use std::fmt;

/// The methods a grant may name. HEAD, OPTIONS and TRACE cannot be granted.
pub const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "PATCH"];

/// One `allow` (or `catalog`, cap, health-check) entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    method: String,
    template: String,
    segments: Vec<Segment>,
}

/// One path segment of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `*`: exactly one non-empty segment of unreserved characters.
    Wild,
}

/// Why a route pattern or a request target was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// Not two whitespace-separated fields.
    #[error("route {0:?} is not exactly \"METHOD /path\"")]
    Shape(String),
    /// A method outside [`METHODS`].
    #[error(
        "route {route:?}: method {method} cannot be granted (only GET, PUT, POST, DELETE, PATCH)"
    )]
    Method {
        /// The whole entry.
        route: String,
        /// The method as written.
        method: String,
    },
    /// A path that does not start with `/`.
    #[error("route {0:?}: the path must be absolute")]
    Relative(String),
    /// A path that breaks a pattern rule.
    #[error("route {route:?}: {rule}")]
    Path {
        /// The whole entry.
        route: String,
        /// The rule it breaks.
        rule: &'static str,
    },
}

// === impl Route ===

impl Route {
    /// Parses `"METHOD /path"`, upper-casing the method and checking every pattern rule.
    pub fn parse(entry: &str) -> Result<Self, RouteError> {
        let mut fields = entry.split_whitespace();
        let (Some(method), Some(path), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(RouteError::Shape(entry.to_owned()));
        };
        let method = method.to_ascii_uppercase();
        if !METHODS.contains(&method.as_str()) {
            return Err(RouteError::Method {
                route: entry.to_owned(),
                method,
            });
        }
        if !path.starts_with('/') {
            return Err(RouteError::Relative(entry.to_owned()));
        }
        let path_error = |rule| RouteError::Path {
            route: entry.to_owned(),
            rule,
        };
        check_path(path).map_err(path_error)?;
        let segments = segments(path)
            .map(|s| {
                if s == "*" {
                    Ok(Segment::Wild)
                } else if s.contains('*') {
                    Err(path_error("`*` must fill a whole segment"))
                } else {
                    Ok(Segment::Literal(s.to_owned()))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            template: format!("{method} {path}"),
            method,
            segments,
        })
    }

    /// The upper-case method.
    pub fn method(&self) -> &str {
        &self.method
    }

    /// `"METHOD /template"`, as written (method upper-cased): the trace's route label.
    pub fn template(&self) -> &str {
        &self.template
    }

    /// The path template alone.
    pub fn path(&self) -> &str {
        &self.template[self.method.len() + 1..]
    }

    /// Whether any segment is `*`.
    pub fn has_wildcard(&self) -> bool {
        self.segments.contains(&Segment::Wild)
    }

    /// Whether a checked target matches: same method, same segment count, literals equal
    /// (case-sensitively, or ASCII case-insensitively with `fold_case` for route caps),
    /// and each `*` against one non-empty segment of unreserved characters.
    pub fn matches(&self, method: &str, target: &Target<'_>, fold_case: bool) -> bool {
        let method_ok = if fold_case {
            self.method.eq_ignore_ascii_case(method)
        } else {
            self.method == method
        };
        method_ok
            && self.segments.len() == target.segments.len()
            && self
                .segments
                .iter()
                .zip(&target.segments)
                .all(|(pattern, seg)| match pattern {
                    Segment::Wild => !seg.is_empty() && seg.bytes().all(is_unreserved),
                    Segment::Literal(lit) if fold_case => lit.eq_ignore_ascii_case(seg),
                    Segment::Literal(lit) => lit == seg,
                })
    }

    /// Whether `other` (same method and length) has `*` where `self` has a fixed segment
    /// and could match some path `self` matches: it would widen a cap on `self`.
    pub fn widened_by(&self, other: &Route) -> bool {
        if self == other
            || !self.method.eq_ignore_ascii_case(&other.method)
            || self.segments.len() != other.segments.len()
        {
            return false;
        }
        let mut wider = false;
        for (mine, theirs) in self.segments.iter().zip(&other.segments) {
            match (mine, theirs) {
                (Segment::Literal(_), Segment::Wild) => wider = true,
                (Segment::Literal(a), Segment::Literal(b)) if !a.eq_ignore_ascii_case(b) => {
                    return false;
                }
                _ => {}
            }
        }
        wider
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.template)
    }
}

/// A request target that passed [`Target::check`]: safe to match and to send as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    raw: &'a str,
    segments: Vec<&'a str>,
}

// === impl Target ===

impl<'a> Target<'a> {
    /// Checks a raw request target: non-empty, absolute, no `%`, `?` or `#`, equal to its
    /// own escaped form, canonical, no `\` or control characters, no `;` or all-dot segment.
    pub fn check(raw: &'a str) -> Result<Self, &'static str> {
        if !raw.starts_with('/') {
            return Err("the target must be an absolute path");
        }
        if raw.contains('?') {
            return Err("query strings are never allowed");
        }
        check_path(raw)?;
        Ok(Self {
            raw,
            segments: segments(raw).collect(),
        })
    }

    /// The target exactly as sent.
    pub fn as_str(&self) -> &'a str {
        self.raw
    }
}

/// The segments after the leading `/` (none for the root).
fn segments(path: &str) -> impl Iterator<Item = &str> {
    let rest = &path[1..];
    rest.split('/').filter(move |_| !rest.is_empty())
}

/// The pattern rules shared by routes and targets. `path` starts with `/`.
fn check_path(path: &str) -> Result<(), &'static str> {
    if path.chars().any(|c| c == '\\') {
        return Err("the path contains a backslash");
    }
    if path.chars().any(char::is_control) {
        return Err("the path contains a control character");
    }
    if path.contains('?') || path.contains('#') {
        return Err("the path contains `?` or `#` (no query strings or fragments)");
    }
    if path.contains('%') {
        return Err("the path must be already decoded (no `%`)");
    }
    if !path.bytes().all(|b| b == b'/' || is_path_safe(b)) {
        return Err("the path needs wire encoding");
    }
    if path != "/" && path.ends_with('/') {
        return Err("the path is not canonical (trailing `/`)");
    }
    for segment in segments(path) {
        if segment.is_empty() {
            return Err("the path is not canonical (`//`)");
        }
        if segment.bytes().all(|b| b == b'.') {
            return Err("the path has a segment made only of dots");
        }
        if segment.contains(';') {
            return Err("the path has a segment containing `;`");
        }
    }
    Ok(())
}

/// RFC 3986 unreserved: what a `*` may match.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Bytes a path segment carries unescaped (unreserved plus the sub-delims, `:` and `@`;
/// `*` is a sub-delim, so a template with `*` passes as it would with `x`).
fn is_path_safe(b: u8) -> bool {
    is_unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(s: &str) -> Route {
        Route::parse(s).unwrap()
    }

    fn hit(r: &str, method: &str, target: &str) -> bool {
        route(r).matches(method, &Target::check(target).unwrap(), false)
    }

    #[test]
    fn methods_are_upper_cased_and_limited() {
        assert_eq!(route("get /items").template(), "GET /items");
        for bad in ["HEAD /x", "OPTIONS /x", "TRACE /x", "FETCH /x"] {
            assert!(
                matches!(Route::parse(bad), Err(RouteError::Method { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn shape_must_be_two_fields_with_an_absolute_path() {
        for bad in ["GET", "GET /a /b", "", "  "] {
            assert!(
                matches!(Route::parse(bad), Err(RouteError::Shape(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Route::parse("GET a/b"),
            Err(RouteError::Relative(_))
        ));
    }

    #[test]
    fn pattern_rules_are_enforced() {
        for bad in [
            "GET /a\\b",
            "GET /a?b",
            "GET /a#b",
            "GET /a%2fb",
            "GET /a//b",
            "GET /a/",
            "GET /a/./b",
            "GET /a/../b",
            "GET /a/.../b",
            "GET /a;x/b",
            "GET /a/b*",
            "GET /caf\u{e9}",
            "GET /a b",
            "GET /a\u{7f}",
            "GET /a\"b",
            "GET /a[0]",
        ] {
            assert!(
                matches!(
                    Route::parse(bad),
                    Err(RouteError::Path { .. } | RouteError::Shape(_))
                ),
                "{bad:?} was accepted"
            );
        }
        for good in [
            "GET /",
            "GET /a/*/b",
            "POST /v2/abc:run",
            "GET /a.json",
            "GET /~x/@y",
        ] {
            Route::parse(good).unwrap();
        }
    }

    #[test]
    fn wildcard_matches_one_unreserved_segment() {
        assert!(hit("GET /items/*", "GET", "/items/a-b_c.d~e"));
        assert!(!hit("GET /items/*", "GET", "/items"));
        assert!(!hit("GET /items/*", "GET", "/items/a/b"));
        assert!(!hit("GET /items/*", "GET", "/items/a:b"));
        assert!(!hit("GET /items/*", "GET", "/items/a$b"));
        assert!(!hit("GET /items/*", "GET", "/items/a@b"));
        assert!(!hit("GET /items/*", "POST", "/items/a"));
    }

    #[test]
    fn literals_compare_case_sensitively_unless_folding() {
        assert!(!hit("GET /Items", "GET", "/items"));
        let r = route("GET /Items");
        assert!(r.matches("get", &Target::check("/items").unwrap(), true));
    }

    #[test]
    fn root_matches_only_root() {
        assert!(hit("GET /", "GET", "/"));
        assert!(!hit("GET /", "GET", "/a"));
        assert!(!hit("GET /*", "GET", "/"));
    }

    #[test]
    fn unsafe_targets_are_refused() {
        for bad in [
            "", "items", "/a?x=1", "/a%2e", "/a/../b", "/a//b", "/a/", "/..;/x", "/a#f", "/a\\b",
            "/a;b", "/\u{1}",
        ] {
            assert!(Target::check(bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn a_wildcard_entry_widens_a_fixed_cap() {
        let capped = route("POST /v2/ep1");
        assert!(capped.widened_by(&route("POST /v2/*")));
        assert!(!capped.widened_by(&route("POST /v3/*")));
        assert!(!capped.widened_by(&route("GET /v2/*")));
        assert!(!capped.widened_by(&route("POST /v2/ep1/*")));
        assert!(!capped.widened_by(&capped.clone()));
    }
}

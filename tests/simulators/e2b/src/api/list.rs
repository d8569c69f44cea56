//! `GET /v2/sandboxes` (keyset pages, newest first, `X-Next-Token`) and the v1 `GET /sandboxes`.
//!
//! Paging works as E2B's does: sandboxes sort by start time (microseconds) descending, then
//! id ascending (the exact reverse with `order=asc`); a page holds `limit` (1..=100, default
//! 100) and, when more follow, `X-Next-Token` is base64url of `<RFC 3339 time>__<id>` (plus
//! `__asc`) of its last item. The `metadata` filter is a query string inside the parameter
//! (`k=v&k2=v2`, each part URL-encoded), every pair must match.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE;
use http::{HeaderValue, StatusCode};
use serde_json::Value;

use super::error;
use crate::app::App;
use crate::http::{Request, Response, json, query_pairs, query_unescape};
use crate::sandbox::{Sandbox, State};

const MAX_LIMIT: u32 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Desc,
    Asc,
}

/// A parsed page position.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cursor {
    time: SystemTime,
    id: String,
}

pub fn list_v2(app: &App, request: &Request) -> Response {
    match list_page(app, request.uri().query()) {
        Ok(response) => response,
        Err(message) => error(StatusCode::BAD_REQUEST, &message),
    }
}

fn list_page(app: &App, query: Option<&str>) -> Result<Response, String> {
    let mut states = vec![State::Running, State::Paused];
    let mut metadata = None;
    let mut limit = MAX_LIMIT;
    let mut order = Order::Desc;
    let mut token = None;
    let mut template = None;
    let mut started_after = None;
    for (name, value) in query_pairs(query) {
        match name.as_str() {
            "metadata" => {
                metadata = Some(parse_metadata(&value).map_err(|_| "Error parsing metadata")?)
            }
            "state" => {
                states = value
                    .split(',')
                    .map(|s| match s {
                        "running" => Ok(State::Running),
                        "paused" => Ok(State::Paused),
                        _ => Err(format!(
                            "parameter \"state\" in query has an error: value {s} is not one of the allowed values [\"running\",\"paused\"]"
                        )),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "limit" => limit = parse_limit(&value)?,
            "order" => {
                order = match value.as_str() {
                    "desc" => Order::Desc,
                    "asc" => Order::Asc,
                    other => {
                        return Err(format!("Invalid order parameter: unknown order {other:?}"));
                    }
                }
            }
            "nextToken" if !value.is_empty() => token = Some(value),
            "template" => template = Some(value),
            "startedAfter" => started_after = Some(parse_time(&value).ok_or_else(|| {
                format!(
                    "parameter \"startedAfter\" in query has an error: {value:?} is not a date-time"
                )
            })?),
            _ => {}
        }
    }
    let cursor = match token {
        Some(token) => Some(parse_cursor(&token, order).ok_or("Invalid next token")?),
        None => None,
    };
    let sandboxes = app.sandboxes.lock();
    let mut matching: Vec<&Sandbox> = sandboxes
        .values()
        .filter(|s| states.contains(&s.state))
        .filter(|s| metadata.as_ref().is_none_or(|m| matches_metadata(s, m)))
        .filter(|s| {
            template
                .as_deref()
                .is_none_or(|t| t == s.template.id || t == s.template.alias)
        })
        .filter(|s| started_after.is_none_or(|after| s.pagination_time() >= after))
        .collect();
    let running = matching
        .iter()
        .filter(|s| s.state == State::Running)
        .count();
    matching.sort_by(|a, b| {
        let by_time = b
            .pagination_time()
            .cmp(&a.pagination_time())
            .then(a.id.cmp(&b.id));
        match order {
            Order::Desc => by_time,
            Order::Asc => by_time.reverse(),
        }
    });
    if let Some(cursor) = &cursor {
        matching.retain(|s| after_cursor(s, cursor, order));
    }
    let more = matching.len() > limit as usize;
    matching.truncate(limit as usize);
    let next = more
        .then(|| matching.last().map(|s| make_cursor(s, order)))
        .flatten();
    let page: Vec<Value> = matching.iter().map(|s| s.listed()).collect();
    drop(sandboxes);
    let mut response = json(StatusCode::OK, &page);
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert("x-next-token", next);
    }
    if states.contains(&State::Running) {
        response
            .headers_mut()
            .insert("x-total-running", HeaderValue::from(running));
    }
    Ok(response)
}

/// The deprecated v1 list: running sandboxes only, one page.
pub fn list_v1(app: &App, request: &Request) -> Response {
    let metadata = match query_pairs(request.uri().query())
        .into_iter()
        .find(|(name, _)| name == "metadata")
    {
        Some((_, value)) => match parse_metadata(&value) {
            Ok(m) => Some(m),
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("Error parsing metadata: {e}"),
                );
            }
        },
        None => None,
    };
    let sandboxes = app.sandboxes.lock();
    let page: Vec<Value> = sandboxes
        .values()
        .filter(|s| s.state == State::Running)
        .filter(|s| metadata.as_ref().is_none_or(|m| matches_metadata(s, m)))
        .map(Sandbox::listed)
        .collect();
    drop(sandboxes);
    json(StatusCode::OK, &page)
}

fn parse_limit(value: &str) -> Result<u32, String> {
    let n: i64 = value.parse().map_err(|_| {
        format!("parameter \"limit\" in query has an error: value {value}: an invalid integer: invalid syntax")
    })?;
    if n < 1 {
        return Err(
            "parameter \"limit\" in query has an error: number must be at least 1".to_owned(),
        );
    }
    if n > i64::from(MAX_LIMIT) {
        return Err(format!(
            "parameter \"limit\" in query has an error: number must be at most {MAX_LIMIT}"
        ));
    }
    Ok(n as u32)
}

/// E2B's `parseFilters`: the value is unescaped once more, split on `&` and `=`, and each
/// key and value unescaped again.
fn parse_metadata(value: &str) -> Result<BTreeMap<String, String>, String> {
    let query = query_unescape(value)?;
    let mut filters = BTreeMap::new();
    for pair in query.split('&') {
        let parts: Vec<&str> = pair.split('=').collect();
        let [key, value] = parts.as_slice() else {
            return Err("invalid key value pair in query".to_owned());
        };
        filters.insert(query_unescape(key)?, query_unescape(value)?);
    }
    Ok(filters)
}

fn matches_metadata(sandbox: &Sandbox, filter: &BTreeMap<String, String>) -> bool {
    filter
        .iter()
        .all(|(k, v)| sandbox.metadata.get(k) == Some(v))
}

fn after_cursor(sandbox: &Sandbox, cursor: &Cursor, order: Order) -> bool {
    let time = sandbox.pagination_time();
    match order {
        Order::Desc => time < cursor.time || (time == cursor.time && sandbox.id > cursor.id),
        Order::Asc => time > cursor.time || (time == cursor.time && sandbox.id < cursor.id),
    }
}

fn make_cursor(sandbox: &Sandbox, order: Order) -> String {
    let mut raw = format!(
        "{}__{}",
        go_rfc3339_nano(sandbox.pagination_time()),
        sandbox.id
    );
    if order == Order::Asc {
        raw.push_str("__asc");
    }
    URL_SAFE.encode(raw)
}

fn parse_cursor(token: &str, order: Order) -> Option<Cursor> {
    let raw = String::from_utf8(URL_SAFE.decode(token).ok()?).ok()?;
    let parts: Vec<&str> = raw.split("__").collect();
    let (time, id, asc) = match parts.as_slice() {
        [time, id] => (*time, *id, false),
        [time, id, "asc"] => (*time, *id, true),
        _ => return None,
    };
    if asc != (order == Order::Asc) {
        return None;
    }
    let time = parse_time(time)?;
    let micros = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_micros();
    Some(Cursor {
        time: SystemTime::UNIX_EPOCH + Duration::from_micros(micros as u64),
        id: id.to_owned(),
    })
}

/// Go's `time.RFC3339Nano` in UTC: the fraction without trailing zeros.
fn go_rfc3339_nano(time: SystemTime) -> String {
    let text = humantime::format_rfc3339_nanos(time).to_string();
    let Some(body) = text.strip_suffix('Z') else {
        return text;
    };
    match body.split_once('.') {
        Some((seconds, fraction)) => {
            let fraction = fraction.trim_end_matches('0');
            if fraction.is_empty() {
                format!("{seconds}Z")
            } else {
                format!("{seconds}.{fraction}Z")
            }
        }
        None => text,
    }
}

/// RFC 3339 with `Z` or a `±HH:MM` offset.
fn parse_time(text: &str) -> Option<SystemTime> {
    if text.ends_with('Z') || text.ends_with('z') {
        return humantime::parse_rfc3339(text).ok();
    }
    let split = text.len().checked_sub(6)?;
    let (base, offset) = text.split_at(split);
    let sign = match offset.as_bytes().first()? {
        b'+' => 1i64,
        b'-' => -1,
        _ => return None,
    };
    let hours: i64 = offset.get(1..3)?.parse().ok()?;
    let minutes: i64 = offset.get(4..6)?.parse().ok()?;
    let utc = humantime::parse_rfc3339(&format!("{base}Z")).ok()?;
    let shift = Duration::from_secs((hours * 3600 + minutes * 60).unsigned_abs());
    if sign > 0 {
        utc.checked_sub(shift)
    } else {
        utc.checked_add(shift)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_unescape_like_e2b() {
        // What E2B's SDK sends for {"a b": "x&y", "k": "v"}, after the query layer's decode.
        let m = parse_metadata("a%2520b=x%2526y&k=v").unwrap();
        assert_eq!(m["a b"], "x&y");
        assert_eq!(m["k"], "v");
        assert!(parse_metadata("novalue").is_err());
        assert!(parse_metadata("a=b=c").is_err());
    }

    #[test]
    fn cursors_round_trip_and_keep_their_order() {
        let time = SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
        let raw = format!("{}__abc", go_rfc3339_nano(time));
        assert_eq!(raw, "2023-11-14T22:13:20.123456Z__abc");
        let token = URL_SAFE.encode(&raw);
        let cursor = parse_cursor(&token, Order::Desc).unwrap();
        assert_eq!(cursor.time, time);
        assert_eq!(cursor.id, "abc");
        assert!(parse_cursor(&token, Order::Asc).is_none());
        assert!(parse_cursor("not base64!", Order::Desc).is_none());
    }

    #[test]
    fn times_with_offsets_parse() {
        let z = parse_time("2024-01-01T10:00:00Z").unwrap();
        assert_eq!(parse_time("2024-01-01T12:00:00+02:00").unwrap(), z);
        assert_eq!(parse_time("2024-01-01T09:30:00-00:30").unwrap(), z);
        assert_eq!(go_rfc3339_nano(z), "2024-01-01T10:00:00Z");
    }
}

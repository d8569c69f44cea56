//! Structured logs on stderr: one JSON object per line by default (keys
//! `time`, `level`, `msg`, then the event's fields, in order), or
//! `key=value` text for people (`PLIMSOLL_LOG_FORMAT=text`). Log lines are a
//! machine interface: tools parse `plimsolld listening` and `code run`.

use std::fmt;
use std::time::SystemTime;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogFormat;

/// Installs the global subscriber at INFO. Call once, first thing.
pub fn init(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO);
    // A second init (tests) keeps the first subscriber.
    let _ = builder.event_format(Lines { format }).try_init();
}

/// The line format.
struct Lines {
    format: LogFormat,
}

/// The event's fields, in the order they were written.
#[derive(Default)]
struct Fields(Vec<(String, Value)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .push((field.name().to_owned(), Value::String(format!("{value:?}"))));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .push((field.name().to_owned(), Value::String(value.to_owned())));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.push((field.name().to_owned(), Value::from(value)));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name().to_owned(), Value::from(value)));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.push((field.name().to_owned(), Value::Bool(value)));
    }
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let msg = fields
            .0
            .iter()
            .position(|(k, _)| k == "message")
            .map(|i| fields.0.remove(i).1)
            .unwrap_or(Value::String(String::new()));
        let time = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let level = event.metadata().level().as_str();
        match self.format {
            LogFormat::Json => {
                let mut line = String::from("{");
                push_json(&mut line, "time", &Value::String(time));
                line.push(',');
                push_json(&mut line, "level", &Value::String(level.to_owned()));
                line.push(',');
                push_json(&mut line, "msg", &msg);
                for (k, v) in &fields.0 {
                    line.push(',');
                    push_json(&mut line, k, v);
                }
                line.push('}');
                writeln!(w, "{line}")
            }
            LogFormat::Text => {
                write!(w, "time={time} level={level} msg={}", text_value(&msg))?;
                for (k, v) in &fields.0 {
                    write!(w, " {k}={}", text_value(v))?;
                }
                writeln!(w)
            }
        }
    }
}

fn push_json(line: &mut String, key: &str, value: &Value) {
    line.push_str(&Value::String(key.to_owned()).to_string());
    line.push(':');
    line.push_str(&value.to_string());
}

fn text_value(v: &Value) -> String {
    match v {
        Value::String(s)
            if !s.is_empty()
                && !s.contains([' ', '"', '='])
                && !s.chars().any(char::is_control) =>
        {
            s.clone()
        }
        Value::String(s) => Value::String(s.clone()).to_string(),
        other => other.to_string(),
    }
}

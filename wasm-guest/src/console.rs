//! `console`, `print`, and how values, errors and unhandled rejections are shown.
//!
//! Values are shown the way `qjs` and `node` show them, on one line: strings as they are
//! at the top level and quoted inside containers, `[ 1, 2 ]`, `{ a: 1 }`, `Map(1) { 'a' =>
//! 1 }`, errors with their stack. Nesting deeper than [`MAX_DEPTH`] shows as `[Object]`,
//! and containers show at most [`MAX_ITEMS`] entries.

use std::cell::RefCell;
use std::io::Write;
use std::rc::Rc;

use rquickjs::function::Rest;
use rquickjs::runtime::RejectionTracker;
use rquickjs::{Coerced, Ctx, Function, Object, Persistent, Type, Value};

/// How deep containers are opened before showing `[Object]`/`[Array]`.
const MAX_DEPTH: usize = 2;
/// How many entries a container shows before `... N more items`.
const MAX_ITEMS: usize = 100;

/// Defines `console` and `print` on the global object. Every console method prints to
/// stdout, as `qjs` with upstream's one-line shim does (providers.md §3.4): only an uncaught
/// error reaches stderr.
pub fn install(ctx: &Ctx<'_>) -> rquickjs::Result<()> {
    let console = Object::new(ctx.clone())?;
    for name in ["log", "info", "debug", "trace", "error", "warn"] {
        console.set(name, printer(ctx)?)?;
    }
    ctx.globals().set("console", console)?;
    ctx.globals().set("print", printer(ctx)?)?;
    Ok(())
}

fn printer<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Function<'js>> {
    Function::new(ctx.clone(), move |ctx: Ctx<'js>, args: Rest<Value<'js>>| {
        let mut line = String::new();
        for (i, arg) in args.0.iter().enumerate() {
            if i > 0 {
                line.push(' ');
            }
            match arg.as_string() {
                Some(s) => line.push_str(&s.to_string().unwrap_or_default()),
                None => line.push_str(&inspect(&ctx, arg, 0, &mut Vec::new())),
            }
        }
        line.push('\n');
        // The host never fails a write (it drops bytes past its cap), so an error here
        // has nowhere useful to go.
        let _ = std::io::stdout().lock().write_all(line.as_bytes());
    })
}

/// The text an uncaught value prints: an error's `Name: message` and stack, a string as
/// it is, anything else as `console.log` would show it.
pub fn describe_error<'js>(ctx: &Ctx<'js>, value: &Value<'js>) -> String {
    if let Some(s) = value.as_string() {
        return s.to_string().unwrap_or_default();
    }
    if value.is_error() {
        return error_text(ctx, value);
    }
    inspect(ctx, value, 0, &mut Vec::new())
}

fn error_text<'js>(ctx: &Ctx<'js>, value: &Value<'js>) -> String {
    let head = coerce(ctx, value);
    let stack = value
        .as_object()
        .and_then(|o| o.get::<_, Option<String>>("stack").ok().flatten())
        .unwrap_or_default();
    let stack = stack.trim_end();
    if stack.is_empty() {
        head
    } else if stack.starts_with(&head) {
        stack.to_owned()
    } else {
        format!("{head}\n{stack}")
    }
}

/// `String(value)`, or a placeholder when that throws (a symbol, a hostile `toString`).
fn coerce<'js>(ctx: &Ctx<'js>, value: &Value<'js>) -> String {
    match value.get::<Coerced<String>>() {
        Ok(Coerced(s)) => s,
        Err(_) => {
            // Clear the pending exception so the snippet keeps running.
            let _ = ctx.catch();
            "[object]".to_owned()
        }
    }
}

fn inspect<'js>(
    ctx: &Ctx<'js>,
    value: &Value<'js>,
    depth: usize,
    seen: &mut Vec<Value<'js>>,
) -> String {
    match value.type_of() {
        Type::Uninitialized | Type::Undefined => "undefined".to_owned(),
        Type::Null => "null".to_owned(),
        Type::Bool => value.as_bool().unwrap_or_default().to_string(),
        Type::Int => value.as_int().unwrap_or_default().to_string(),
        Type::Float => match value.as_float() {
            Some(f) if f == 0.0 && f.is_sign_negative() => "-0".to_owned(),
            _ => coerce(ctx, value),
        },
        Type::String => quote(
            &value
                .as_string()
                .and_then(|s| s.to_string().ok())
                .unwrap_or_default(),
        ),
        Type::BigInt => format!("{}n", coerce(ctx, value)),
        Type::Symbol => {
            let description = value
                .as_symbol()
                .and_then(|s| s.description().ok())
                .and_then(|d| d.as_string().and_then(|s| s.to_string().ok()))
                .unwrap_or_default();
            format!("Symbol({description})")
        }
        Type::Function | Type::Constructor => {
            let name = value
                .as_object()
                .and_then(|o| o.get::<_, Option<String>>("name").ok().flatten())
                .unwrap_or_default();
            if name.is_empty() {
                "[Function (anonymous)]".to_owned()
            } else {
                format!("[Function: {name}]")
            }
        }
        Type::Promise => "Promise {}".to_owned(),
        _ if value.is_error() => error_text(ctx, value),
        Type::Array | Type::Object | Type::Proxy | Type::Exception => {
            container(ctx, value, depth, seen)
        }
        _ => coerce(ctx, value),
    }
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            _ => out.push(c),
        }
    }
    out.push('\'');
    out
}

fn container<'js>(
    ctx: &Ctx<'js>,
    value: &Value<'js>,
    depth: usize,
    seen: &mut Vec<Value<'js>>,
) -> String {
    let Some(object) = value.as_object() else {
        return coerce(ctx, value);
    };
    if seen.contains(value) {
        return "[Circular]".to_owned();
    }
    let class = constructor_name(object);
    if value.is_array() && depth > MAX_DEPTH {
        return "[Array]".to_owned();
    }
    match class.as_str() {
        "Date" => {
            return call_method(ctx, object, "toISOString").unwrap_or_else(|| coerce(ctx, value));
        }
        "RegExp" => return coerce(ctx, value),
        _ => {}
    }
    if depth > MAX_DEPTH {
        return format!("[{}]", if class.is_empty() { "Object" } else { &class });
    }
    seen.push(value.clone());
    let text = match class.as_str() {
        "Map" | "Set" => collection(ctx, value, &class, depth, seen),
        _ if value.is_array() => array(ctx, object, depth, seen),
        _ => plain(ctx, object, &class, depth, seen),
    };
    seen.pop();
    text
}

fn constructor_name(object: &Object<'_>) -> String {
    object
        .get::<_, Option<Object>>("constructor")
        .ok()
        .flatten()
        .and_then(|c| c.get::<_, Option<String>>("name").ok().flatten())
        .unwrap_or_default()
}

fn call_method<'js>(ctx: &Ctx<'js>, object: &Object<'js>, name: &str) -> Option<String> {
    let method = object.get::<_, Function>(name).ok()?;
    match method.call::<_, String>((rquickjs::function::This(object.clone()),)) {
        Ok(s) => Some(s),
        Err(_) => {
            let _ = ctx.catch();
            None
        }
    }
}

fn array<'js>(
    ctx: &Ctx<'js>,
    object: &Object<'js>,
    depth: usize,
    seen: &mut Vec<Value<'js>>,
) -> String {
    let len = object.get::<_, usize>("length").unwrap_or_default();
    let mut parts = Vec::with_capacity(len.min(MAX_ITEMS) + 1);
    for i in 0..len.min(MAX_ITEMS) {
        let item = object.get::<_, Value>(i as u32).unwrap_or_else(|_| {
            let _ = ctx.catch();
            Value::new_undefined(ctx.clone())
        });
        parts.push(inspect(ctx, &item, depth + 1, seen));
    }
    if len > MAX_ITEMS {
        parts.push(format!("... {} more items", len - MAX_ITEMS));
    }
    bracket("[", parts, "]")
}

fn plain<'js>(
    ctx: &Ctx<'js>,
    object: &Object<'js>,
    class: &str,
    depth: usize,
    seen: &mut Vec<Value<'js>>,
) -> String {
    let mut parts = Vec::new();
    let mut total = 0usize;
    for key in object.keys::<String>() {
        let Ok(key) = key else {
            let _ = ctx.catch();
            break;
        };
        total += 1;
        if parts.len() == MAX_ITEMS {
            continue;
        }
        let value = object.get::<_, Value>(key.as_str()).unwrap_or_else(|_| {
            let _ = ctx.catch();
            Value::new_undefined(ctx.clone())
        });
        let shown_key = if is_identifier(&key) {
            key
        } else {
            quote(&key)
        };
        parts.push(format!(
            "{shown_key}: {}",
            inspect(ctx, &value, depth + 1, seen)
        ));
    }
    if total > MAX_ITEMS {
        parts.push(format!("... {} more items", total - MAX_ITEMS));
    }
    let body = bracket("{", parts, "}");
    if class.is_empty() || class == "Object" {
        body
    } else {
        format!("{class} {body}")
    }
}

fn collection<'js>(
    ctx: &Ctx<'js>,
    value: &Value<'js>,
    class: &str,
    depth: usize,
    seen: &mut Vec<Value<'js>>,
) -> String {
    let entries = ctx
        .globals()
        .get::<_, Object>("Array")
        .and_then(|a| a.get::<_, Function>("from"))
        .and_then(|from| from.call::<_, Vec<Value>>((value.clone(),)));
    let entries = match entries {
        Ok(entries) => entries,
        Err(_) => {
            let _ = ctx.catch();
            return format!("{class} {{}}");
        }
    };
    let mut parts = Vec::new();
    for entry in entries.iter().take(MAX_ITEMS) {
        if class == "Map" {
            let pair = entry.as_array();
            let k = pair.and_then(|p| p.get::<Value>(0).ok());
            let v = pair.and_then(|p| p.get::<Value>(1).ok());
            let undefined = Value::new_undefined(ctx.clone());
            parts.push(format!(
                "{} => {}",
                inspect(ctx, k.as_ref().unwrap_or(&undefined), depth + 1, seen),
                inspect(ctx, v.as_ref().unwrap_or(&undefined), depth + 1, seen)
            ));
        } else {
            parts.push(inspect(ctx, entry, depth + 1, seen));
        }
    }
    if entries.len() > MAX_ITEMS {
        parts.push(format!("... {} more items", entries.len() - MAX_ITEMS));
    }
    format!("{class}({}) {}", entries.len(), bracket("{", parts, "}"))
}

fn bracket(open: &str, parts: Vec<String>, close: &str) -> String {
    if parts.is_empty() {
        format!("{open}{close}")
    } else {
        format!("{open} {} {close}", parts.join(", "))
    }
}

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
}

// === impl RejectionLog ===

/// A rejected promise and its reason, kept past the scope they were made in.
type Rejection = (Persistent<Value<'static>>, Persistent<Value<'static>>);

/// Promises rejected with no handler attached, in order. The interpreter reports a
/// rejection when it happens and again if a handler is attached later, so what is left
/// once the job queue is empty went unhandled.
#[derive(Clone, Default)]
pub struct RejectionLog {
    open: Rc<RefCell<Vec<Rejection>>>,
}

impl RejectionLog {
    /// The tracker to give the runtime.
    pub fn tracker(&self) -> RejectionTracker {
        let open = self.open.clone();
        Box::new(move |ctx, promise, reason, handled| {
            let mut open = open.borrow_mut();
            if handled {
                open.retain(|(p, _)| p.clone().restore(&ctx).map_or(true, |p| p != promise));
            } else {
                open.push((
                    Persistent::save(&ctx, promise),
                    Persistent::save(&ctx, reason),
                ));
            }
        })
    }

    /// The reason of the first rejection still unhandled, if any.
    pub fn take_first<'js>(&self, ctx: &Ctx<'js>) -> Option<Value<'js>> {
        let mut open = self.open.borrow_mut();
        if open.is_empty() {
            return None;
        }
        let (_, reason) = open.remove(0);
        reason.restore(ctx).ok()
    }
}

//! The wasm provider's guest: a QuickJS interpreter for one snippet.
//!
//! plimsolld instantiates this module once per run under wasmtime, with WASI preview 1 and
//! nothing else: no preopened directories, no environment, no arguments, no sockets. The
//! guest reads the snippet (UTF-8) from stdin, evaluates it as a sloppy-mode global script
//! that may use top-level `await`, runs promise jobs and timers until none are left, and
//! exits.
//!
//! - `console.log` (also `info`, `debug`, `trace`, `error`, `warn` and `print`) writes a
//!   line to stdout (providers.md §3.4: all console output goes to stdout).
//! - `scriptArgs` is empty, and an en-US `Intl.NumberFormat` (decimal, currency, percent;
//!   fraction digits; grouping) backs `Number.prototype.toLocaleString` (`intl.js`).
//! - An uncaught exception or an unhandled rejection prints the error (and its stack) on
//!   stderr and exits 1. Running out of memory inside the interpreter is an exception too;
//!   running out of memory in the guest's own Rust code aborts (a trap, which the host
//!   reports as exit 134).
//! - `setTimeout`/`setInterval` and their `clear*` functions exist; timers run after the
//!   script, in deadline order. Nothing else is added: no `require`, `process`, `fetch`,
//!   `std` or `os`.
//!
//! - `__coderunner_host_call(envelope)` always exists (see [`host_call`]). For a granted
//!   run the host sends a prelude (the host client library) before the snippet, separated
//!   by one NUL byte; a snippet never holds a NUL, so the last NUL is the split. The prelude
//!   runs first, as its own script, so the snippet's line numbers stay its own.
//!
//! The host bounds everything else (memory, time, output); the guest only has to be a
//! faithful interpreter.

mod console;
mod host_call;
mod memory;
mod timers;

use std::io::{Read, Write};
use std::process::ExitCode;

use rquickjs::allocator::RustAllocator;
use rquickjs::context::EvalOptions;
use rquickjs::promise::PromiseState;
use rquickjs::{Context, Ctx, Promise, Runtime, Value};

/// The interpreter's own stack limit, below the 8 MiB shadow stack (see
/// `.cargo/config.toml`) so that the interpreter's check, not a stack overrun, stops it.
/// In practice the host's limit on wasm stack depth is reached first, and deep recursion
/// ends as a trap.
const MAX_STACK_BYTES: usize = 4 * 1024 * 1024;

/// The name errors and stacks give the snippet.
const FILE_NAME: &str = "<snippet>";

/// QuickJS drops an exception thrown by a `queueMicrotask` callback; as a promise reaction
/// it becomes an unhandled rejection, which ends the run like any uncaught error.
const MICROTASK_SHIM: &str = "globalThis.queueMicrotask = function queueMicrotask(callback) { \
    if (typeof callback !== 'function') throw new TypeError('the callback must be a function'); \
    Promise.resolve().then(() => callback()); };";

/// `scriptArgs` and the `Intl.NumberFormat` polyfill (providers.md §3.4).
const GLOBALS_SHIM: &str = include_str!("intl.js");

/// Why the guest could not run the snippet at all (never the snippet's own failure).
const EXIT_GUEST_FAILURE: u8 = 70;

fn main() -> ExitCode {
    let mut code = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut code) {
        eprintln!("guest: cannot read the snippet from stdin: {e}");
        return ExitCode::from(EXIT_GUEST_FAILURE);
    }
    let status = match run(code) {
        Ok(status) => status,
        Err(e) => {
            eprintln!("guest: cannot start the interpreter: {e}");
            EXIT_GUEST_FAILURE
        }
    };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    ExitCode::from(status)
}

/// The name errors give the prelude.
const PRELUDE_NAME: &str = "<host-client>";

/// Runs one snippet to the end; the exit status is 0 unless something went uncaught.
fn run(input: String) -> rquickjs::Result<u8> {
    let (prelude, code) = match input.rsplit_once('\0') {
        Some((prelude, code)) => (Some(prelude.to_owned()), code.to_owned()),
        None => (None, input),
    };
    let runtime = Runtime::new_with_alloc(memory::WatchedAllocator(RustAllocator))?;
    runtime.set_max_stack_size(MAX_STACK_BYTES);
    let unhandled = console::RejectionLog::default();
    runtime.set_host_promise_rejection_tracker(Some(unhandled.tracker()));
    let context = Context::full(&runtime)?;
    let status = context.with(|ctx| {
        let queue = timers::TimerQueue::default();
        console::install(&ctx)?;
        queue.install(&ctx)?;
        ctx.eval::<(), _>(MICROTASK_SHIM)?;
        ctx.eval::<(), _>(GLOBALS_SHIM)?;
        host_call::install(&ctx)?;
        if let Some(prelude) = prelude {
            let mut options = EvalOptions::default();
            options.strict = false;
            options.filename = Some(PRELUDE_NAME.to_owned());
            match ctx.eval_with_options::<(), _>(prelude, options) {
                Ok(()) => {}
                Err(rquickjs::Error::Exception) => return Ok(uncaught(&ctx, ctx.catch())),
                Err(other) => return Err(other),
            }
        }
        let mut options = EvalOptions::default();
        options.strict = false;
        options.promise = true;
        options.filename = Some(FILE_NAME.to_owned());
        let completion = match ctx.eval_with_options::<Promise, _>(code, options) {
            Ok(promise) => promise,
            Err(rquickjs::Error::Exception) => return Ok(uncaught(&ctx, ctx.catch())),
            Err(other) => return Err(other),
        };
        loop {
            drain_jobs(&ctx);
            if let PromiseState::Rejected = completion.state() {
                let reason = completion
                    .result::<Value>()
                    .and_then(Result::err)
                    .map(|_| ctx.catch())
                    .unwrap_or_else(|| Value::new_undefined(ctx.clone()));
                return Ok(uncaught(&ctx, reason));
            }
            if let Some(reason) = unhandled.take_first(&ctx) {
                return Ok(uncaught(&ctx, reason));
            }
            match queue.run_next(&ctx) {
                timers::Step::Ran(Ok(())) => {}
                timers::Step::Ran(Err(reason)) => return Ok(uncaught(&ctx, reason)),
                timers::Step::Empty => return Ok(0),
            }
        }
    });
    // The process ends right after this; freeing the interpreter's heap would only cost
    // time (a full collection) in every run.
    std::mem::forget(context);
    std::mem::forget(runtime);
    status
}

/// Runs pending promise jobs until none are left. A job never throws here: a throwing
/// promise reaction rejects its promise, and `queueMicrotask` is redefined (see
/// [`MICROTASK_SHIM`]) so that its callback runs as a promise reaction too.
fn drain_jobs(ctx: &Ctx<'_>) {
    while ctx.execute_pending_job() {}
}

/// Prints an uncaught value on stderr the way `qjs` does and returns the exit status.
fn uncaught<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> u8 {
    let text = if memory::ran_out() && (value.is_null() || value.is_undefined()) {
        // QuickJS could not even allocate its out-of-memory error.
        "InternalError: out of memory".to_owned()
    } else {
        console::describe_error(ctx, &value)
    };
    let _ = std::io::stdout().flush();
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = err.write_all(b"\n");
    }
    1
}

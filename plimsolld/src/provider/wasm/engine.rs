//! The wasmtime side of the wasm provider: one [`Engine`] with epoch interruption, the
//! guest compiled once and pre-linked ([`InstancePre`]), and [`Prepared::run`], which gives
//! every snippet a fresh [`Store`] and instance.
//!
//! Per run (providers.md §3.2): WASI preview 1 with the snippet on stdin, stdout and stderr
//! into capped pipes, no arguments, no environment, no preopened directories, no sockets;
//! a memory cap through [`MemoryCap`]; a deadline checked on every epoch tick.

use std::time::{Duration, Instant};

use wasmtime::{Caller, Config, Engine, Extern, InstancePre, Linker, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{I32Exit, WasiCtxBuilder};

use super::WasmError;
use super::cache::{self, Source};
use super::host_call::{self, Relay};
use super::limits::{EpochTicker, MemoryCap};
use super::output::{CappedPipe, Captured, OUTPUT_CAP};

/// How often the epoch advances, and so how late after its deadline a run may end.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// The exit code of a run the deadline ended.
pub const EXIT_TIMED_OUT: i32 = 124;
/// The exit code of a run that trapped (an abort, a stack overflow, a wasm fault).
pub const EXIT_TRAPPED: i32 = 134;

/// The guest's entry point (a WASI command).
const ENTRY: &str = "_start";

/// What one run's store holds.
struct RunState {
    wasi: WasiP1Ctx,
    memory: MemoryCap,
    /// The run's broker socket, when it has a grant.
    relay: Option<Relay>,
}

/// What a run produced, before the provider turns it into a `SnippetOutcome`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestExit {
    /// The guest's exit code (124 for the deadline, 134 for a trap).
    pub exit_code: i32,
    /// Whether the deadline ended the run.
    pub timed_out: bool,
    /// What the guest wrote to stdout, capped.
    pub stdout: Captured,
    /// What the guest wrote to stderr, capped.
    pub stderr: Captured,
    /// Whether the memory cap refused a growth during the run.
    pub memory_cap_hit: bool,
    /// Instantiation plus execution.
    pub duration: Duration,
}

/// The engine, the compiled and linked guest, and the per-run memory cap.
pub struct Prepared {
    engine: Engine,
    guest: InstancePre<RunState>,
    memory_pages: u64,
    /// Where the compiled guest came from.
    pub source: Source,
}

// === impl Prepared ===

impl Prepared {
    /// Builds the engine, starts its epoch ticker, and compiles (or loads from the cache)
    /// and links the guest. This is the slow part of startup.
    pub fn new(
        module: &[u8],
        module_sha256: &str,
        memory_pages: u64,
    ) -> Result<Prepared, WasmError> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        let engine = Engine::new(&config).map_err(|e| WasmError::Engine(format!("{e:#}")))?;
        let (compiled, source) = cache::load_or_compile(&engine, module, module_sha256)
            .map_err(|e| WasmError::Compile(format!("{e:#}")))?;
        let mut linker: Linker<RunState> = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |state: &mut RunState| &mut state.wasi)
            .map_err(|e| WasmError::Link(format!("{e:#}")))?;
        linker
            .func_wrap("coderunner", "host_call", guest_host_call)
            .map_err(|e| WasmError::Link(format!("{e:#}")))?;
        let guest = linker
            .instantiate_pre(&compiled)
            .map_err(|e| WasmError::Link(format!("{e:#}")))?;
        EpochTicker::start(engine.weak(), EPOCH_TICK).map_err(WasmError::Ticker)?;
        Ok(Prepared {
            engine,
            guest,
            memory_pages,
            source,
        })
    }

    /// Runs one snippet in a fresh instance. Blocks the calling thread until the guest
    /// exits, traps or reaches `timeout`; call it off the async reactor.
    ///
    /// A guest's exit, trap or timeout is a [`GuestExit`]; only a failure of the engine
    /// itself is an error.
    pub fn run(
        &self,
        code: Vec<u8>,
        timeout: Duration,
        relay: Option<Relay>,
    ) -> Result<GuestExit, WasmError> {
        let stdout = CappedPipe::new(OUTPUT_CAP);
        let stderr = CappedPipe::new(OUTPUT_CAP);
        // No args, no environment, no preopens, no sockets: the builder grants none of
        // them unless asked.
        let wasi = WasiCtxBuilder::new()
            .stdin(MemoryInputPipe::new(code))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build_p1();
        let started = Instant::now();
        let deadline = started + timeout;
        // One deadline for the guest and for its host calls.
        let relay = relay.map(|r| Relay { deadline, ..r });
        let mut store = Store::new(
            &self.engine,
            RunState {
                wasi,
                memory: MemoryCap::new(self.memory_pages),
                relay,
            },
        );
        store.limiter(|state| &mut state.memory);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Continue(1))
            }
        });
        let ended = self
            .guest
            .instantiate(&mut store)
            .and_then(|instance| instance.get_typed_func::<(), ()>(&mut store, ENTRY))
            .and_then(|entry| entry.call(&mut store, ()));
        let duration = started.elapsed();
        let memory_cap_hit = store.data().memory.refused;
        let mut stderr = stderr.take();
        let (exit_code, timed_out) = match ended {
            Ok(()) => (0, false),
            Err(e) => match exit_of(&e) {
                Some((EXIT_TRAPPED, false)) if stderr.bytes.is_empty() => {
                    stderr.bytes = abort_text(&e, memory_cap_hit, self.memory_pages).into_bytes();
                    (EXIT_TRAPPED, false)
                }
                Some(exit) => exit,
                None => return Err(WasmError::Run(format!("{e:#}"))),
            },
        };
        Ok(GuestExit {
            exit_code,
            timed_out,
            stdout: stdout.take(),
            stderr,
            memory_cap_hit,
            duration,
        })
    }
}

/// `coderunner.host_call`: reads the envelope from guest memory, relays it (see
/// [`host_call`]) and writes the body back. Never traps: every failure is a status.
fn guest_host_call(
    mut caller: Caller<'_, RunState>,
    req_ptr: i32,
    req_len: i32,
    resp_ptr: i32,
    resp_cap: i32,
) -> wasmtime::Result<i64> {
    const FAILED: i64 = (500i64) << 32;
    if !host_call::envelope_len_ok(req_len) {
        return Ok(host_call::pack(413, 0));
    }
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        return Ok(FAILED);
    };
    let (Ok(req_ptr), Ok(req_len), Ok(resp_ptr), Ok(resp_cap)) = (
        usize::try_from(req_ptr as u32),
        usize::try_from(req_len),
        usize::try_from(resp_ptr as u32),
        usize::try_from(resp_cap as u32),
    ) else {
        return Ok(FAILED);
    };
    let mut envelope = vec![0u8; req_len];
    if memory.read(&caller, req_ptr, &mut envelope).is_err() {
        return Ok(FAILED);
    }
    let Some(answer) = host_call::answer(caller.data().relay.as_ref(), &envelope, resp_cap) else {
        // The run's deadline came while the call waited: end the run as the epoch
        // deadline would, so it is reported as timed out.
        return Err(wasmtime::Error::new(Trap::Interrupt));
    };
    let Ok(length) = u32::try_from(answer.body.len()) else {
        return Ok(FAILED);
    };
    if answer.body.len() > resp_cap || memory.write(&mut caller, resp_ptr, &answer.body).is_err() {
        return Ok(FAILED);
    }
    Ok(host_call::pack(answer.status, length))
}

/// The exit code (and whether it is the deadline) an engine error stands for, or `None`
/// when it is not the guest's doing.
fn exit_of(e: &wasmtime::Error) -> Option<(i32, bool)> {
    if let Some(I32Exit(code)) = e.downcast_ref::<I32Exit>() {
        return Some((*code, false));
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => Some((EXIT_TIMED_OUT, true)),
        Some(_) => Some((EXIT_TRAPPED, false)),
        None => None,
    }
}

/// What stderr says when a trapped guest left it empty (providers.md §3.3).
fn abort_text(e: &wasmtime::Error, memory_cap_hit: bool, memory_pages: u64) -> String {
    let trap = e
        .downcast_ref::<Trap>()
        .map_or_else(|| e.to_string(), ToString::to_string);
    if memory_cap_hit {
        format!(
            "guest aborted: wasm error: {trap} (after reaching the {} MiB memory cap)\n",
            memory_pages / 16
        )
    } else {
        format!("guest aborted: wasm error: {trap}\n")
    }
}

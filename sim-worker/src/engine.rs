//! The one wasmtime configuration both sides use: `sim-precompile` compiles with it on the host,
//! the worker loads with it in the image.
//!
//! wasmtime refuses an artifact whose engine settings differ from the loading engine's (its
//! version, target, tunables such as epoch interruption and memory layout, and wasm
//! features: a module's features must be a subset of the host's). The settings that would
//! otherwise follow wasmtime's *crate* features, which differ between the two builds (the
//! host tool links Cranelift, the async runtime and the component model; the worker only the
//! runtime), are set explicitly here, so both engines agree whatever was compiled in.

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, WasmFeatures};

/// The largest linear memory one model instance may have: 256 pages, 16 MiB.
pub const MAX_MEMORY_BYTES: usize = 16 << 20;
/// The most table entries one instance may have (a Rust model's function table is tiny).
pub const MAX_TABLE_ELEMENTS: usize = 10_000;
/// The deepest wasm call stack a model may use, in bytes.
pub const MAX_WASM_STACK: usize = 512 << 10;

/// The configuration every model is compiled and loaded with.
pub fn config() -> Config {
    let mut config = Config::new();
    // The run's deadline: an epoch tick stops a running model at its next loop head or call.
    config.epoch_interruption(true);
    config.max_wasm_stack(MAX_WASM_STACK);
    // A memory reserves only what it may ever use, plus a small guard: explicit bounds checks
    // in the compiled code (cheap for scalar models) instead of a 4 GiB reservation and a
    // 2 GiB guard per instance, whose mapping changes are slow under gVisor.
    config.memory_reservation(MAX_MEMORY_BYTES as u64);
    config.memory_guard_size(64 << 10);
    config.memory_reservation_for_growth(0);
    config.guard_before_linear_memory(false);
    // Scalar models only: no SIMD (artifacts then need nothing past the baseline x86-64 or
    // aarch64 vector unit), no threads, no GC, no exceptions, no component model, no 64-bit
    // memories. Each of these is off whatever wasmtime's crate features would default to.
    config.wasm_features(
        WasmFeatures::SIMD
            | WasmFeatures::RELAXED_SIMD
            | WasmFeatures::THREADS
            | WasmFeatures::SHARED_EVERYTHING_THREADS
            | WasmFeatures::GC
            | WasmFeatures::GC_TYPES
            | WasmFeatures::EXCEPTIONS
            | WasmFeatures::LEGACY_EXCEPTIONS
            | WasmFeatures::STACK_SWITCHING
            | WasmFeatures::COMPONENT_MODEL
            | WasmFeatures::CM_ASYNC
            | WasmFeatures::MEMORY64,
        false,
    );
    config
}

/// The engine for [`config`], as `sim-precompile` uses it, compiling for a fixed CPU baseline.
///
/// Left to itself Cranelift targets every feature the build machine's CPU reports, and the
/// worker refuses an artifact that needs a feature its CPU lacks. The build machine and the
/// sandbox can disagree even on one host: gVisor hides some features (AVX-VNNI, for one)
/// that runc passes through. So the target is named explicitly (which turns inference off)
/// and only x86-64-v2 is enabled: SSE4.1 keeps `floor`, `ceil` and `nearest` native, and
/// every x86-64 host and sandbox this runs on has it.
#[cfg(feature = "compile")]
pub fn engine() -> wasmtime::Result<Engine> {
    let mut config = config();
    config.target(&host_triple())?;
    if cfg!(target_arch = "x86_64") {
        for flag in [
            "has_sse3",
            "has_ssse3",
            "has_sse41",
            "has_sse42",
            "has_popcnt",
        ] {
            // SAFETY: these are Cranelift's own x86-64 feature flags, and wasmtime checks
            // each one an artifact records against the loading CPU before it runs any code.
            #[allow(unsafe_code)]
            unsafe {
                config.cranelift_flag_enable(flag);
            }
        }
    }
    Engine::new(&config)
}

/// The triple this crate was built for, as wasmtime parses it.
#[cfg(feature = "compile")]
fn host_triple() -> String {
    let arch = std::env::consts::ARCH;
    match std::env::consts::OS {
        "linux" => format!("{arch}-unknown-linux-gnu"),
        os => format!("{arch}-unknown-{os}"),
    }
}

/// The worker's engine: [`config`] with a pool of two instance slots (the shape check's and a
/// row's), so each row reuses a slot's memory instead of mapping and unmapping a fresh
/// multi-gigabyte reservation; a slot is zeroed between rows. A run of many short rows then
/// costs a few system calls a row, which matters most under gVisor, where each mapping
/// change is handled by its kernel. The allocation strategy is the loading engine's own
/// business: it is not part of what an artifact records, so artifacts compiled with
/// [`config`] load here.
pub fn runtime_engine() -> wasmtime::Result<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(2)
        .total_memories(2)
        .total_tables(2)
        .max_memory_size(MAX_MEMORY_BYTES)
        .table_elements(MAX_TABLE_ELEMENTS)
        // Zero a reused memory with memset, never madvise: its pages stay mapped, so the next
        // row takes no page fault (each one is a trip through gVisor's kernel).
        .linear_memory_keep_resident(MAX_MEMORY_BYTES)
        .table_keep_resident(64 << 10);
    let mut config = config();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config)
}

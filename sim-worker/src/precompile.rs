//! Ahead-of-time compilation of a model (feature `compile`, host side only): what
//! `sim-precompile` does for images/module/build.
//!
//! The artifact is compiled with [`engine::config`](crate::engine::config), checked against
//! the model ABI exactly as the worker will check it (by loading the artifact back the way
//! the worker loads it), and only then written.

use std::path::Path;

use crate::model::{Model, ModelError};

/// Why a model could not be precompiled.
#[derive(Debug, thiserror::Error)]
pub enum PrecompileError {
    /// The engine did not start.
    #[error("the engine does not start: {0}")]
    Engine(String),
    /// The input could not be read or the output written.
    #[error("{path}: {source}")]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// Cranelift refused the module (not valid WebAssembly, or a feature models may not use).
    #[error("{id}: does not compile: {detail}")]
    Compile { id: String, detail: String },
    /// The compiled model breaks the ABI.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Compiles the WebAssembly module at `wasm` into `<out_dir>/<id>/model.cwasm`, checked; returns
/// the model's shape.
pub fn precompile(wasm: &Path, out_dir: &Path, id: &str) -> Result<Model, PrecompileError> {
    let engine = crate::engine::engine().map_err(|e| PrecompileError::Engine(format!("{e:#}")))?;
    // A model whose shape functions never return is given up on, as the worker would.
    let _deadline = crate::limits::Deadline::start(&engine, std::time::Duration::from_secs(10))
        .map_err(|e| PrecompileError::Engine(e.to_string()))?;
    let bytes = std::fs::read(wasm).map_err(|source| PrecompileError::File {
        path: wasm.to_path_buf(),
        source,
    })?;
    let compiled = engine
        .precompile_module(&bytes)
        .map_err(|e| PrecompileError::Compile {
            id: id.to_owned(),
            detail: format!("{e:#}"),
        })?;
    if !crate::model::valid_id(id) {
        return Err(ModelError::BadId(id.to_owned()).into());
    }
    let dir = out_dir.join(id);
    let file = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PrecompileError::File { path, source }
    };
    std::fs::create_dir_all(&dir).map_err(file(&dir))?;
    let path = dir.join(crate::model::ARTIFACT);
    std::fs::write(&path, compiled).map_err(file(&path))?;
    match Model::load(&engine, out_dir, id) {
        Ok(model) => Ok(model),
        Err(e) => {
            // Nothing that fails the worker's checks stays where the image build would copy it.
            let _ = std::fs::remove_file(&path);
            Err(e.into())
        }
    }
}

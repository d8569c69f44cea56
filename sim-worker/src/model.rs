//! A model: one precompiled artifact under the models directory, checked against the ABI
//! (docs/modules.md) before any row runs.

use std::path::{Path, PathBuf};

use wasmtime::{Engine, ExternType, InstancePre, Linker, Module, Store, TypedFunc, ValType};

use crate::engine::MAX_MEMORY_BYTES;
use crate::limits::RowLimits;

/// Where the image keeps its models: `/models/<id>/model.cwasm`.
pub const MODELS_DIR: &str = "/models";
/// The artifact's file name inside a model's directory.
pub const ARTIFACT: &str = "model.cwasm";
/// The ABI version this worker speaks (`plimsoll_abi` returns it).
pub const ABI_VERSION: i32 = 1;

/// The exports a model must have, with their types: `(name, params, results)`.
pub const EXPORTS: &[(&str, &[ValType], &[ValType])] = &[
    ("plimsoll_abi", &[], &[ValType::I32]),
    ("plimsoll_params", &[], &[ValType::I32]),
    ("plimsoll_outputs", &[], &[ValType::I32]),
    ("plimsoll_params_ptr", &[], &[ValType::I32]),
    ("plimsoll_outputs_ptr", &[], &[ValType::I32]),
    ("plimsoll_init", &[], &[ValType::I32]),
    (
        "plimsoll_step",
        &[ValType::F64, ValType::F64],
        &[ValType::I32],
    ),
];

/// Why a model cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The id is not a model id.
    #[error("{0:?} is not a model id ([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})")]
    BadId(String),
    /// There is no such model.
    #[error("no model {id:?} in {dir}")]
    Missing { id: String, dir: PathBuf },
    /// wasmtime refused the artifact (another wasmtime or configuration, not an artifact).
    #[error("model {id:?} does not load: {detail}")]
    Load { id: String, detail: String },
    /// The module breaks the ABI.
    #[error("model {id:?} breaks the model ABI: {detail}")]
    Abi { id: String, detail: String },
}

/// The per-row state a model's store holds.
#[derive(Debug, Default)]
pub struct RowState {
    /// The row's memory and table caps.
    pub limits: RowLimits,
}

/// A loaded, checked model.
pub struct Model {
    /// Its id (the directory name).
    pub id: String,
    /// Parameters per row.
    pub params: u32,
    /// Outputs per step.
    pub outputs: u32,
    pre: InstancePre<RowState>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("id", &self.id)
            .field("params", &self.params)
            .field("outputs", &self.outputs)
            .finish_non_exhaustive()
    }
}

/// Whether `id` is a model id as the wire allows (wire.md §6.5): one path component that
/// is never `.` or `..`.
pub fn valid_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    (1..=64).contains(&bytes.len())
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Model {
    /// Loads model `id` from `dir` and checks it against the ABI.
    pub fn load(engine: &Engine, dir: &Path, id: &str) -> Result<Model, ModelError> {
        if !valid_id(id) {
            return Err(ModelError::BadId(id.to_owned()));
        }
        let path = dir.join(id).join(ARTIFACT);
        // A regular file, not reached through a link: the artifact is mapped as code.
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            _ => {
                return Err(ModelError::Missing {
                    id: id.to_owned(),
                    dir: dir.to_path_buf(),
                });
            }
        }
        let module = deserialize(engine, &path).map_err(|e| ModelError::Load {
            id: id.to_owned(),
            detail: format!("{e:#}"),
        })?;
        Model::check(engine, id, &module)
    }

    /// Checks a compiled module against the ABI and reads its shape.
    pub fn check(engine: &Engine, id: &str, module: &Module) -> Result<Model, ModelError> {
        let abi = |detail: String| ModelError::Abi {
            id: id.to_owned(),
            detail,
        };
        if let Some(import) = module.imports().next() {
            return Err(abi(format!(
                "it imports {}::{}; a model imports nothing",
                import.module(),
                import.name()
            )));
        }
        match module.get_export("memory") {
            Some(ExternType::Memory(memory)) => {
                if memory.is_64() || memory.is_shared() {
                    return Err(abi("its memory is not a plain 32-bit memory".into()));
                }
                let initial = memory.minimum().saturating_mul(memory.page_size());
                if initial > MAX_MEMORY_BYTES as u64 {
                    return Err(abi(format!(
                        "its initial memory is {initial} bytes, over the {MAX_MEMORY_BYTES} byte limit"
                    )));
                }
            }
            _ => return Err(abi("it exports no memory named \"memory\"".into())),
        }
        for (name, params, results) in EXPORTS {
            let Some(ExternType::Func(func)) = module.get_export(name) else {
                return Err(abi(format!("it exports no function {name}")));
            };
            let same = |got: &mut dyn ExactSizeIterator<Item = ValType>, want: &[ValType]| {
                got.len() == want.len() && got.zip(want).all(|(g, w)| ValType::eq(&g, w))
            };
            if !same(&mut func.params(), params) || !same(&mut func.results(), results) {
                return Err(abi(format!("{name} has the type {func}")));
            }
        }
        let pre = Linker::new(engine)
            .instantiate_pre(module)
            .map_err(|e| abi(format!("{e:#}")))?;
        let mut model = Model {
            id: id.to_owned(),
            params: 0,
            outputs: 0,
            pre,
        };
        let (version, params, outputs) = model.shape().map_err(abi)?;
        if version != ABI_VERSION {
            return Err(abi(format!(
                "it speaks ABI version {version}; this worker speaks {ABI_VERSION}"
            )));
        }
        let width = |n: i32, what: &str| match u32::try_from(n) {
            Ok(n) if (1..=sim_format::MAX_WIDTH as u32).contains(&n) => Ok(n),
            _ => Err(abi(format!(
                "it states {n} {what}; 1 to {} are allowed",
                sim_format::MAX_WIDTH
            ))),
        };
        model.params = width(params, "parameters")?;
        model.outputs = width(outputs, "outputs")?;
        Ok(model)
    }

    /// Calls the three shape functions in a throwaway instance.
    fn shape(&self) -> Result<(i32, i32, i32), String> {
        // Under whatever deadline the caller started: a shape function that never returns
        // traps when it passes, like a row.
        let mut store = self.store();
        let instance = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| format!("it does not instantiate: {e:#}"))?;
        let mut call = |name: &str| -> Result<i32, String> {
            let f: TypedFunc<(), i32> = instance
                .get_typed_func(&mut store, name)
                .map_err(|e| format!("{e:#}"))?;
            f.call(&mut store, ())
                .map_err(|e| format!("{name} failed: {e:#}"))
        };
        Ok((
            call("plimsoll_abi")?,
            call("plimsoll_params")?,
            call("plimsoll_outputs")?,
        ))
    }

    /// A fresh store with the row caps, trapping at the engine's next epoch (the deadline).
    pub fn store(&self) -> Store<RowState> {
        let mut store = Store::new(self.pre.module().engine(), RowState::default());
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(1);
        store.epoch_deadline_trap();
        store
    }

    /// The pre-linked module, for instantiating rows.
    pub fn pre(&self) -> &InstancePre<RowState> {
        &self.pre
    }
}

/// The ids of the models in `dir`, sorted: every subdirectory holding an artifact.
pub fn list(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(id) = entry.file_name().into_string() else {
            continue;
        };
        if valid_id(&id) && entry.path().join(ARTIFACT).is_file() {
            ids.push(id);
        }
    }
    ids.sort();
    Ok(ids)
}

/// Maps a precompiled artifact as code.
// SAFETY (of the function): `Module::deserialize_file` maps the file as executable code
// without validating it, so it must be exactly what `Engine::precompile_module` wrote, and
// must not change while the module lives. In the module image both hold: every
// `/models/<id>/model.cwasm` was written by `sim-precompile` (this crate, the same wasmtime
// version and `engine::config`) from a model built from this repository's sources by
// images/module/build, and the image's root is mounted read-only in every run, so no guest
// can replace or change it (the worker itself runs as the unprivileged guest uid). `load`
// opens only `<dir>/<valid id>/model.cwasm` as a regular file, never through a link. Beyond
// that, wasmtime checks the artifact's header (its version, target, engine settings and
// features) and refuses one built for another engine. A `--models` directory other than
// /models (the image build's check and the tests) must hold `sim-precompile` output too.
#[allow(unsafe_code)]
fn deserialize(engine: &Engine, path: &Path) -> wasmtime::Result<Module> {
    // SAFETY: see the function comment: `path` is an unmodified `sim-precompile` artifact on
    // a read-only root.
    unsafe { Module::deserialize_file(engine, path) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_are_single_safe_path_components() {
        for id in ["damped-oscillator", "a", "A.b_c-9", &"x".repeat(64)] {
            assert!(valid_id(id), "{id}");
        }
        for id in [
            "",
            ".",
            "..",
            "-x",
            ".x",
            "a/b",
            "a b",
            &"x".repeat(65),
            "é",
        ] {
            assert!(!valid_id(id), "{id}");
        }
    }
}

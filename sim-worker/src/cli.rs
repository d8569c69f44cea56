//! The worker's command line. Every failure is one line on stderr and an exit code from
//! [`sim_format::exit`]; the results file exists only when the exit is 0.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sim_format::exit;
use sim_format::grid::Grid;

use crate::limits::Deadline;
use crate::model::{self, Model};

/// How long `--list` may take before a model that never answers its shape is given up on.
const LIST_DEADLINE: Duration = Duration::from_secs(10);

/// What a run was asked to do.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRun {
    /// The model id.
    pub model: String,
    /// The parameter table to read.
    pub params: PathBuf,
    /// The results file to write.
    pub results: PathBuf,
    /// The grid's end time.
    pub end_time: f64,
    /// The grid's step.
    pub step: f64,
    /// The largest results file allowed.
    pub max_result_bytes: u64,
    /// The run's deadline, from the worker's start.
    pub deadline: Duration,
    /// Where the models are.
    pub models: PathBuf,
}

const USAGE: &str = "usage: sim-worker --table <model> <params> <results> <end_time> <step> <max_result_bytes> <deadline_ms> [--models DIR]\n       sim-worker --list [--models DIR]";

/// Runs the command line `args` (without the program name); returns the exit code.
pub fn main(args: &[String]) -> i32 {
    let (args, models) = match split_models(args) {
        Ok(split) => split,
        Err(message) => return usage(&message),
    };
    match args.first().map(String::as_str) {
        Some("--list") if args.len() == 1 => list(&models),
        Some("--table") => match table_run(&args[1..], models) {
            Ok(run) => table(&run),
            Err(message) => usage(&message),
        },
        _ => usage("no command"),
    }
}

fn usage(message: &str) -> i32 {
    eprintln!("sim-worker: {message}\n{USAGE}");
    exit::USAGE
}

/// Takes a trailing `--models DIR` off `args`.
fn split_models(args: &[String]) -> Result<(&[String], PathBuf), String> {
    match args {
        [rest @ .., flag, dir] if flag == "--models" => Ok((rest, PathBuf::from(dir))),
        _ if args.iter().any(|a| a == "--models") => Err("--models DIR goes last".into()),
        _ => Ok((args, PathBuf::from(model::MODELS_DIR))),
    }
}

/// Parses `--table`'s seven arguments.
pub fn table_run(args: &[String], models: PathBuf) -> Result<TableRun, String> {
    let [
        model,
        params,
        results,
        end_time,
        step,
        max_bytes,
        deadline_ms,
    ] = args
    else {
        return Err(format!("--table takes 7 arguments, got {}", args.len()));
    };
    let positive = |text: &str, what: &str| -> Result<f64, String> {
        text.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| format!("{what} {text:?} is not a finite number above 0"))
    };
    let whole = |text: &str, what: &str| -> Result<u64, String> {
        text.parse::<u64>()
            .ok()
            .filter(|v| *v > 0)
            .ok_or_else(|| format!("{what} {text:?} is not a whole number above 0"))
    };
    Ok(TableRun {
        model: model.clone(),
        params: PathBuf::from(params),
        results: PathBuf::from(results),
        end_time: positive(end_time, "end_time")?,
        step: positive(step, "step")?,
        max_result_bytes: whole(max_bytes, "max_result_bytes")?,
        deadline: Duration::from_millis(whole(deadline_ms, "deadline_ms")?),
        models,
    })
}

/// `--list`: one line per model, `<id> params=<n> outputs=<m>`; exit 1 when any model does not
/// load (the image is broken).
fn list(models: &Path) -> i32 {
    let ids = match model::list(models) {
        Ok(ids) => ids,
        Err(e) => {
            eprintln!("sim-worker: cannot list {}: {e}", models.display());
            return exit::LOAD_FAILED;
        }
    };
    let Ok((engine, _deadline)) = engine_with_deadline(LIST_DEADLINE) else {
        return exit::LOAD_FAILED;
    };
    let mut code = exit::OK;
    for id in ids {
        match Model::load(&engine, models, &id) {
            Ok(m) => println!("{} params={} outputs={}", m.id, m.params, m.outputs),
            Err(e) => {
                eprintln!("sim-worker: {e}");
                code = exit::LOAD_FAILED;
            }
        }
    }
    code
}

fn engine_with_deadline(after: Duration) -> Result<(wasmtime::Engine, Deadline), ()> {
    let engine = crate::engine::runtime_engine().map_err(|e| {
        eprintln!("sim-worker: the engine does not start: {e:#}");
    })?;
    let deadline = Deadline::start(&engine, after).map_err(|e| {
        eprintln!("sim-worker: cannot start the deadline thread: {e}");
    })?;
    Ok((engine, deadline))
}

/// `--table`: load, read the table, check the budget, run every row, write the file.
fn table(run: &TableRun) -> i32 {
    // The deadline starts first: loading a model is part of the run's time.
    let Ok((engine, deadline)) = engine_with_deadline(run.deadline) else {
        return exit::LOAD_FAILED;
    };
    let model = match Model::load(&engine, &run.models, &run.model) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("sim-worker: {e}");
            return exit::LOAD_FAILED;
        }
    };
    let text = match std::fs::read_to_string(&run.params) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("sim-worker: cannot read {}: {e}", run.params.display());
            return exit::MALFORMED_TABLE;
        }
    };
    let values = match sim_format::table::parse(&text, model.params as usize) {
        Ok(values) => values,
        Err(e) => {
            eprintln!("sim-worker: the parameter table is refused: {e}");
            return exit::MALFORMED_TABLE;
        }
    };
    drop(text);
    let rows = (values.len() / model.params as usize) as u64;
    let grid = Grid::new(run.end_time, run.step);
    let bound = sim_format::results::bound(rows, u64::from(model.outputs), grid.steps());
    if bound > run.max_result_bytes {
        eprintln!(
            "sim-worker: {rows} rows of up to {} steps of {} outputs could need {bound} bytes, over the {} byte budget",
            grid.steps(),
            model.outputs,
            run.max_result_bytes
        );
        return exit::OVER_BUDGET;
    }
    let bytes = crate::run::rows(&model, &values, grid, deadline);
    match write_whole(&run.results, &bytes) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("sim-worker: cannot write {}: {e}", run.results.display());
            exit::NOT_WRITTEN
        }
    }
}

/// Writes `bytes` beside `path`, then renames into place: the file is whole or absent.
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn the_table_command_takes_seven_checked_arguments() {
        let ok = strings(&["m", "p", "r", "10", "0.5", "8388608", "2500"]);
        let run = table_run(&ok, PathBuf::from("/models")).unwrap();
        assert_eq!((run.end_time, run.step), (10.0, 0.5));
        assert_eq!(run.deadline, Duration::from_millis(2500));
        for bad in [
            &["m", "p", "r", "10", "0.5", "8388608"][..],
            &["m", "p", "r", "inf", "0.5", "8388608", "1"][..],
            &["m", "p", "r", "10", "-1", "8388608", "1"][..],
            &["m", "p", "r", "10", "0.5", "0", "1"][..],
            &["m", "p", "r", "10", "0.5", "8388608", "1.5"][..],
        ] {
            assert!(table_run(&strings(bad), PathBuf::new()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn models_dir_goes_last_and_bad_command_lines_exit_2() {
        let args = strings(&["--list", "--models", "/tmp/m"]);
        let (rest, dir) = split_models(&args).unwrap();
        assert_eq!((rest.len(), dir), (1, PathBuf::from("/tmp/m")));
        assert!(split_models(&strings(&["--models", "/x", "--list"])).is_err());
        assert_eq!(main(&strings(&[])), exit::USAGE);
        assert_eq!(main(&strings(&["--table", "m"])), exit::USAGE);
        assert_eq!(main(&strings(&["--list", "extra"])), exit::USAGE);
    }
}

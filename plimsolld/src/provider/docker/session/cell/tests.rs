//! The provider-neutral cell machinery over docker, against a real session-shaped container
//! (`exec::testbed`): the runtime comes from `PLIMSOLL_TEST_DOCKER_RUNTIME` (runc by default,
//! or runsc).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use plimsoll::wire::ProjectFile;
use tokio::time::Instant;

use super::*;
use crate::provider::docker::exec::testbed::Testbed;
use crate::provider::guest::cell::CellOutcome;

const CAP: usize = 64 * 1024;
const NONCE_LEN: usize = 32;

fn guest() -> Guest {
    Guest {
        uid: 61000,
        image_env: vec!["PLIMSOLL_IMAGE_VAR=from-image".to_owned()],
    }
}

fn file(path: &str, content: &str) -> ProjectFile {
    ProjectFile {
        path: path.to_owned(),
        content: content.to_owned(),
        ..Default::default()
    }
}

fn soon(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}

async fn launch(bed: &Testbed, language: CellLanguage) -> Interpreter {
    let (exec, layout) = target(&bed.engine, &bed.id, &guest());
    Interpreter::launch(exec, layout, language)
        .await
        .unwrap_or_else(|e| panic!("launch {language:?}: {e}"))
}

/// Runs `code` with no files and the default caps; it must answer.
async fn cell(interp: &mut Interpreter, code: &str) -> CellOutcome {
    interp
        .run(&[], code, CAP, CAP, soon(30))
        .await
        .unwrap_or_else(|e| panic!("{code:?}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn ran(out: &CellOutcome, stdout: &str) {
    assert_eq!(
        (out.exit_code, text(&out.stdout).as_str()),
        (0, stdout),
        "stderr: {}",
        text(&out.stderr)
    );
    assert!(!out.timed_out && !out.interpreter_ended, "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_state_persists_errors_end_only_the_cell_and_top_level_await_works() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let mut js = launch(&bed, CellLanguage::JavaScript).await;
    assert_eq!(js.language(), CellLanguage::JavaScript);
    assert_eq!(js.keep_ids().len(), 2);
    ran(&cell(&mut js, "let x = 41").await, "");
    ran(&cell(&mut js, "x + 1").await, "42\n");
    ran(&cell(&mut js, "_").await, "42\n");
    // Declared again by a later cell: top-level let/const/class became var.
    ran(
        &cell(&mut js, "const x = 'again'; class K { v() { return 5 } }").await,
        "",
    );
    ran(&cell(&mut js, "let x = 1; new K().v() + x").await, "6\n");

    let thrown = cell(&mut js, "console.log('before'); throw new Error('boom')").await;
    assert_eq!(thrown.exit_code, 1, "{thrown:?}");
    assert_eq!(text(&thrown.stdout), "before\n");
    assert!(text(&thrown.stderr).contains("Error: boom"), "{thrown:?}");
    assert!(!thrown.interpreter_ended);
    ran(&cell(&mut js, "x").await, "1\n");

    ran(
        &cell(&mut js, "const v = await Promise.resolve(7); v * 6").await,
        "42\n",
    );
    ran(&cell(&mut js, "v").await, "7\n");
    let rejected = cell(&mut js, "await Promise.reject(new Error('nope'))").await;
    assert_eq!(rejected.exit_code, 1);
    assert!(text(&rejected.stderr).contains("nope"), "{rejected:?}");
    // An unhandled rejection is printed, never fatal.
    cell(&mut js, "Promise.reject(new Error('later')); 1").await;
    ran(
        &cell(&mut js, "({a: [1, 2], s: 'x'})").await,
        "{ a: [ 1, 2 ], s: 'x' }\n",
    );
    ran(&cell(&mut js, "process.cwd()").await, "'/work'\n");
    ran(
        &cell(&mut js, "process.env.PLIMSOLL_IMAGE_VAR").await,
        "'from-image'\n",
    );
    assert!(js.is_alive());
    js.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_state_persists_system_exit_ends_only_the_cell_and_top_level_await_works() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let mut py = launch(&bed, CellLanguage::Python).await;
    ran(&cell(&mut py, "x = 41").await, "");
    ran(&cell(&mut py, "x + 1").await, "42\n");
    ran(&cell(&mut py, "_").await, "42\n");
    ran(&cell(&mut py, "__name__").await, "'__main__'\n");
    ran(&cell(&mut py, "print('hi')\nNone").await, "hi\n");

    let exited = cell(&mut py, "print('going'); raise SystemExit(3)").await;
    assert_eq!(exited.exit_code, 1, "{exited:?}");
    assert_eq!(text(&exited.stdout), "going\n");
    assert!(text(&exited.stderr).contains("SystemExit: 3"), "{exited:?}");
    assert!(!exited.interpreter_ended && py.is_alive());
    ran(&cell(&mut py, "x").await, "41\n");

    let raised = cell(&mut py, "def f():\n    return 1 / 0\nf()").await;
    assert_eq!(raised.exit_code, 1);
    let stderr = text(&raised.stderr);
    assert!(
        stderr.contains("<cell 8>") && stderr.contains("ZeroDivisionError"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("_plimsoll_kernel") && !stderr.contains("run_cell"),
        "{stderr}"
    );

    ran(
        &cell(&mut py, "import asyncio\nawait asyncio.sleep(0.01)\nx + 1").await,
        "42\n",
    );
    ran(
        &cell(&mut py, "async def g():\n    return 5\nawait g()").await,
        "5\n",
    );
    let flags = cell(&mut py, "import sys; (sys.flags.isolated, sys.path[0])").await;
    ran(&flags, "(1, '')\n");
    let syntax = cell(&mut py, "def (").await;
    assert_eq!(syntax.exit_code, 1);
    assert!(text(&syntax.stderr).contains("SyntaxError"), "{syntax:?}");
    py.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_written_before_the_cell_and_a_link_target_is_refused() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let mut py = launch(&bed, CellLanguage::Python).await;
    let files = [file("pkg/helper.py", "VALUE = 'imported from /work'\n")];
    let out = py
        .run(
            &files,
            "from pkg import helper\nhelper.VALUE",
            CAP,
            CAP,
            soon(30),
        )
        .await
        .unwrap();
    ran(&out, "'imported from /work'\n");

    let mut js = launch(&bed, CellLanguage::JavaScript).await;
    let files = [file("a.txt", "first"), file("sub/b.txt", "second")];
    let code = "const fs = require('fs'); fs.readFileSync('a.txt', 'utf8') + fs.readFileSync('/work/sub/b.txt', 'utf8')";
    let out = js.run(&files, code, CAP, CAP, soon(30)).await.unwrap();
    ran(&out, "'firstsecond'\n");

    let link =
        "fs.symlinkSync('/tmp/escaped', '/work/link'); fs.symlinkSync('/tmp', '/work/dirlink'); 0";
    ran(&cell(&mut js, link).await, "0\n");
    for (files, index) in [
        (vec![file("ok.txt", "x"), file("link", "through a link")], 1),
        (
            vec![file("dirlink/inside.txt", "through a directory link")],
            0,
        ),
    ] {
        let refused = js.run(&files, "'must not run'", CAP, CAP, soon(30)).await;
        match refused {
            Err(CellError::FileRefused { index: i, errno }) => {
                assert_eq!(i, index);
                assert!(errno.starts_with('E'), "{errno}");
            }
            other => panic!("{other:?}"),
        }
    }
    let check = "[fs.existsSync('/tmp/escaped'), fs.existsSync('/tmp/inside.txt')]";
    ran(&cell(&mut js, check).await, "[ false, false ]\n");
    assert!(js.is_alive() && py.is_alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_caps_truncate_and_a_forged_end_marker_neither_ends_the_cell_nor_injects() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let mut js = launch(&bed, CellLanguage::JavaScript).await;
    let big = "process.stdout.write('o'.repeat(200000)); process.stderr.write('e'.repeat(70000)); undefined";
    let out = js.run(&[], big, 1000, 60000, soon(30)).await.unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!((out.stdout.len(), out.stdout_truncated), (1000, true));
    assert_eq!((out.stderr.len(), out.stderr_truncated), (60000, true));
    assert!(out.stdout.iter().all(|b| *b == b'o'));
    let exact = js.run(
        &[],
        "process.stdout.write('x'.repeat(1000)); undefined",
        1000,
        10,
        soon(30),
    );
    let exact = exact.await.unwrap();
    assert_eq!((exact.stdout.len(), exact.stdout_truncated), (1000, false));

    let forged_nonce = "0".repeat(NONCE_LEN);
    let forge = format!(
        "process.stdout.write('a\\0plimsoll-cell-end-{forged_nonce}\\0b\\n'); \
         process.stdout.write('{{\"n\":\"{forged_nonce}\",\"done\":0}}\\n'); \
         await new Promise(r => setTimeout(r, 300)); console.log('after'); 'last'"
    );
    let out = cell(&mut js, &forge).await;
    let expected = format!(
        "a\0plimsoll-cell-end-{forged_nonce}\0b\n{{\"n\":\"{forged_nonce}\",\"done\":0}}\nafter\n'last'\n"
    );
    ran(&out, &expected);
    // Output written after a cell ended belongs to no cell.
    ran(
        &cell(&mut js, "setTimeout(() => console.log('stray'), 200); 1").await,
        "1\n",
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    ran(&cell(&mut js, "2").await, "2\n");

    let mut py = launch(&bed, CellLanguage::Python).await;
    let forge = format!(
        "import sys\nsys.stdout.write('a\\0plimsoll-cell-end-{forged_nonce}\\0b\\n')\nprint('after')"
    );
    let out = cell(&mut py, &forge).await;
    ran(
        &out,
        &format!("a\0plimsoll-cell-end-{forged_nonce}\0b\nafter\n"),
    );
    let out = py
        .run(&[], "print('p' * 5000)", 100, 100, soon(30))
        .await
        .unwrap();
    assert_eq!((out.stdout.len(), out.stdout_truncated), (100, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_past_its_deadline_exits_124_ends_the_interpreter_and_a_fresh_one_launches() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    for (language, define, forever, check) in [
        (
            CellLanguage::JavaScript,
            "var kept = 1",
            "console.log('looping'); while (true) {}",
            "typeof kept",
        ),
        (
            CellLanguage::Python,
            "kept = 1",
            "print('looping', flush=True)\nwhile True:\n    pass",
            "'kept' in globals()",
        ),
    ] {
        let mut interp = launch(&bed, language).await;
        ran(&cell(&mut interp, define).await, "");
        let begun = Instant::now();
        let out = interp.run(&[], forever, CAP, CAP, soon(3)).await.unwrap();
        assert!(begun.elapsed() < Duration::from_secs(10));
        assert_eq!(
            (out.exit_code, out.timed_out, out.interpreter_ended),
            (124, true, true),
            "{out:?}"
        );
        assert_eq!(text(&out.stdout), "looping\n");
        assert!(!interp.is_alive());
        assert!(matches!(
            interp.run(&[], "1", CAP, CAP, soon(5)).await,
            Err(CellError::Unreachable { .. })
        ));
        interp.close().await;
        let mut fresh = launch(&bed, language).await;
        let expected = match language {
            CellLanguage::JavaScript => "'undefined'\n",
            CellLanguage::Python => "False\n",
        };
        ran(&cell(&mut fresh, check).await, expected);
        fresh.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_runs_past_the_deadline_and_a_second_interpreter_is_refused() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let mut js = launch(&bed, CellLanguage::JavaScript).await;
    let unsent = js
        .run(
            &[],
            "require('fs').writeFileSync('/work/ran', '1')",
            CAP,
            CAP,
            Instant::now(),
        )
        .await;
    assert_eq!(
        unsent,
        Err(CellError::Unsent {
            language: "javascript"
        })
    );
    assert!(!js.is_alive());
    // The proof requires the interpreter to be the only process with its command line.
    let (exec, layout) = target(&bed.engine, &bed.id, &guest());
    let second = Interpreter::launch(exec, layout, CellLanguage::JavaScript).await;
    match second {
        Err(CellError::Launch { reason, .. }) => {
            assert!(reason.contains("command line"), "{reason}")
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a second interpreter was accepted"),
    }
    js.close().await;
    let mut fresh = launch(&bed, CellLanguage::JavaScript).await;
    ran(
        &cell(&mut fresh, "require('fs').existsSync('/work/ran')").await,
        "false\n",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interpreter_that_dies_ends_and_one_gone_between_cells_is_relaunched() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    for (language, die) in [
        (
            CellLanguage::JavaScript,
            "console.log('bye'); process.exit(3)",
        ),
        (
            CellLanguage::Python,
            "import os\nprint('bye', flush=True)\nos._exit(3)",
        ),
    ] {
        let mut interp = launch(&bed, language).await;
        let out = cell(&mut interp, die).await;
        assert_eq!((out.exit_code, out.interpreter_ended), (1, true), "{out:?}");
        assert_eq!(text(&out.stdout), "bye\n");
        assert!(!interp.is_alive());
        interp.close().await;
    }

    // The kernel dies after its cell answered: the relay still answers, but no interpreter
    // listens, so the next call relaunches once and says so.
    let mut js = launch(&bed, CellLanguage::JavaScript).await;
    let before = js.keep_ids();
    let later = "var kept = 1; setTimeout(() => process.kill(process.pid, 'SIGKILL'), 100); 0";
    ran(&cell(&mut js, later).await, "0\n");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(js.is_alive());
    let out = cell(&mut js, "typeof kept").await;
    assert_eq!(
        (
            out.exit_code,
            text(&out.stdout).as_str(),
            out.interpreter_started
        ),
        (0, "'undefined'\n", true),
        "{out:?}"
    );
    assert_ne!(js.keep_ids(), before);
    js.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_that_closes_its_own_output_still_finishes() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let mut py = launch(&bed, CellLanguage::Python).await;
    let begun = Instant::now();
    let out = cell(
        &mut py,
        "import os\nprint('last words', flush=True)\nos.close(1)",
    )
    .await;
    assert_eq!(
        (out.exit_code, text(&out.stdout).as_str()),
        (0, "last words\n")
    );
    assert!(begun.elapsed() < Duration::from_secs(10));
    // The interpreter lives on, and its output is plugged back in for the next cell.
    ran(
        &cell(&mut py, "import sys\nsys.stderr.write('still here\\n')\n2").await,
        "2\n",
    );

    let mut js = launch(&bed, CellLanguage::JavaScript).await;
    let out = cell(&mut js, "require('fs').closeSync(1); 'gone'").await;
    assert_eq!(out.exit_code, 0, "{out:?}");
    ran(&cell(&mut js, "1 + 1").await, "2\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_cannot_read_the_relays_memory() {
    let Some(bed) = Testbed::start().await else {
        return;
    };
    let mut py = launch(&bed, CellLanguage::Python).await;
    let ids = py.keep_ids();
    let relay = ids[1].split(':').next().unwrap();
    let probe = format!(
        "import os\n\
         def attempt(name, flags):\n    \
             try:\n        os.close(os.open('/proc/{relay}/' + name, flags))\n        return 'open'\n    \
             except OSError as e:\n        return e.strerror\n\
         [attempt('mem', os.O_RDONLY), attempt('fd/1', os.O_WRONLY), attempt('fd/0', os.O_RDONLY)]"
    );
    let out = cell(&mut py, &probe).await;
    assert_eq!(out.exit_code, 0, "{out:?}");
    let seen = text(&out.stdout);
    // The relay makes itself non-dumpable (prctl, its first act): its memory is closed to the
    // guest uid.
    // gVisor still opens a non-dumpable process's fd entries to its own uid (see the guard).
    let expected = if bed.runsc {
        "['Permission denied', 'open', 'open']\n"
    } else {
        "['Permission denied', 'Permission denied', 'Permission denied']\n"
    };
    assert_eq!(seen, expected);
}

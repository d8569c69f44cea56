//! The toolchain baked into the project image (issue 16), each tool run in a project through
//! the real daemon, offline (every container is on `--network none`) and as the guest uid:
//! TypeScript compiles a file and tsx runs one, eslint lints with its recommended rules,
//! pytest runs a suite, numpy imports in a Python cell. Describe's languages stay what the
//! startup proof proved.

use super::project::{exit_code, project, run_project, steps};
use super::session::{cell, close_as, open, sessions};
use super::*;

/// A daemon with the default process limit (`SANDBOX_PIDS` unset, 256), shared by the tests
/// here that need it. tsc is a native Go program whose runtime starts a thread for each
/// goroutine blocked in a file read; under the shared daemon's limit of 64 (small so fork
/// bombs end fast) it failed on a loaded CI machine with "failed to create new OS thread
/// (have 57 already)". A project image's toolchain is judged at the limit users get.
fn default_limits() -> Arc<Shared> {
    static DAEMON: Mutex<Weak<Shared>> = Mutex::new(Weak::new());
    let mut slot = DAEMON.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = slot.upgrade() {
        return d;
    }
    let d = Arc::new(Shared(Daemon::start(&env_with(&[]))));
    *slot = Arc::downgrade(&d);
    d
}

/// A TypeScript module using Node's own types (`@types/node` is in the image).
const GREETING_TS: &str = "import { platform } from \"node:os\";
export function greet(name: string): string {
    return `hello ${name} from ${platform()}`;
}
console.log(greet(\"tsc\"));
";

const TSCONFIG: &str = r#"{
  "compilerOptions": {
    "target": "es2022",
    "module": "nodenext",
    "strict": true,
    "types": ["node"],
    "rootDir": "src",
    "outDir": "out"
  },
  "include": ["src"]
}
"#;

const ESLINT_CONFIG: &str = "import js from \"@eslint/js\";
import globals from \"globals\";
export default [
    js.configs.recommended,
    { languageOptions: { globals: globals.node } },
];
";

#[test]
fn typescript_compiles_tsx_runs_and_eslint_lints_in_a_project() {
    require_docker!();
    let d = default_limits();
    let body = project(
        &[
            ("src/greet.ts", GREETING_TS),
            ("tsconfig.json", TSCONFIG),
            (
                "src/typo.ts",
                "export const n: number = \"not a number\";\n",
            ),
            ("eslint.config.mjs", ESLINT_CONFIG),
            (
                "clean.js",
                "const total = [1, 2, 3].reduce((a, b) => a + b, 0);\nconsole.log(total);\n",
            ),
            (
                "sloppy.js",
                "let unused = 1;\nconsole.log(undefinedName);\n",
            ),
        ],
        &[
            // A type error fails the build and names the file.
            "tsc -p . > typo.txt; test $? -ne 0 && grep -q 'src/typo.ts' typo.txt",
            "rm src/typo.ts && tsc -p . && node out/greet.js",
            "tsx src/greet.ts",
            "eslint clean.js && echo clean",
            "eslint sloppy.js; test $? -eq 1",
            "tsc --version && tsx --version && eslint --version",
        ],
        &[],
        120_000,
    );
    let v = run_project(&d, &body);
    let steps = steps(&v);
    assert_eq!(v["project"]["outcome"], "PROJECT_OUTCOME_COMPLETED", "{v}");
    assert_eq!(steps.len(), 6, "{v}");
    assert!(steps.iter().all(|s| exit_code(s) == 0), "{v}");
    assert_eq!(field(&steps[1], "stdout"), "hello tsc from linux\n", "{v}");
    assert_eq!(field(&steps[2], "stdout"), "hello tsc from linux\n", "{v}");
    assert_eq!(field(&steps[3], "stdout"), "clean\n", "{v}");
    let lint = field(&steps[4], "stdout");
    for rule in ["no-unused-vars", "no-undef"] {
        assert!(lint.contains(rule), "eslint must report {rule}: {lint}");
    }
    let versions = field(&steps[5], "stdout");
    for (tool, version) in TOOLCHAIN {
        assert!(
            versions.contains(version),
            "{tool} {version} in the image: {versions}"
        );
    }
}

/// The versions the image pins (images/project/toolchain/package.json), as the tools print them.
const TOOLCHAIN: &[(&str, &str)] = &[
    ("typescript", "Version 7.0.2"),
    ("tsx", "tsx v4.23.15"),
    ("eslint", "v10.15.0"),
];

#[test]
fn a_pytest_suite_runs_and_a_failing_test_fails_the_step() {
    require_docker!();
    let d = shared();
    let body = project(
        &[
            (
                "calc.py",
                "import numpy as np\n\ndef mean(xs):\n    return float(np.mean(xs))\n",
            ),
            (
                "tests/test_calc.py",
                "import pytest\nfrom calc import mean\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2.0\n\n@pytest.mark.parametrize('xs,want', [([4], 4.0), ([1, 3], 2.0)])\ndef test_more(xs, want):\n    assert mean(xs) == want\n",
            ),
            ("conftest.py", ""),
            (
                "broken/test_broken.py",
                "def test_wrong():\n    assert 1 + 1 == 3\n",
            ),
        ],
        &["pytest -q tests", "pytest -q broken; test $? -eq 1"],
        &[],
        60_000,
    );
    let v = run_project(&d, &body);
    let steps = steps(&v);
    assert_eq!(steps.len(), 2, "{v}");
    assert!(steps.iter().all(|s| exit_code(s) == 0), "{v}");
    assert!(
        field(&steps[0], "stdout").contains("3 passed"),
        "{}",
        field(&steps[0], "stdout")
    );
    assert!(
        field(&steps[1], "stdout").contains("1 failed"),
        "{}",
        field(&steps[1], "stdout")
    );
}

#[test]
fn numpy_imports_in_a_python_cell() {
    require_docker!();
    let d = sessions();
    let (id, _) = open(&d, json!({}));
    let out = cell(
        &d,
        &id,
        "python",
        "import numpy as np\nprint(np.arange(6).reshape(2, 3).sum(axis=0).tolist(), np.__version__)",
    );
    let stdout = field(&out, "stdout");
    assert!(stdout.starts_with("[3, 5, 7] 2."), "{out}");
    // The interpreter keeps numpy loaded for the next cell.
    let again = cell(&d, &id, "python", "int(np.dot([1, 2, 3], [4, 5, 6]))");
    assert_eq!(field(&again, "stdout"), "32\n", "{again}");
    assert_eq!(close_as(&d, None, &id).status, 200);
}

#[test]
fn describe_states_only_the_proven_languages() {
    require_docker!();
    let d = shared();
    let v = send(d.addr, &connect::call("Describe", &json!({}))).json();
    // The toolchain is not a language: cells run JavaScript and Python only.
    for env in ["projectEnvironment", "sessionEnvironment"] {
        if v[env].is_null() {
            continue;
        }
        assert_eq!(v[env]["languages"], json!(["javascript", "python"]), "{v}");
    }
    assert_eq!(
        v["javascriptEnvironment"]["languages"],
        json!(["javascript"]),
        "{v}"
    );
}

//! Snippet calls (providers.md §9.3): `node -` as the guest uid and gid, with the code on its
//! stdin, the base environment plus the request's. Each stream keeps `cap` bytes and drops
//! the rest; at the deadline the snippet's whole process group is killed and the exit is 124.
//! The snippet changes into /work itself, as the guest (a guest may have made /work 0700).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

use super::child::{self, Cap, Ran, Watch};
use super::env::{self, Env};

const SNIPPET_SCRIPT: &str = "cd /work || exit 127\nexec \"$@\"";
const EXIT_TIMED_OUT: i32 = 124;
const EXIT_NOT_STARTED: i32 = 127;
/// The most a stream keeps, whatever the request asks. Deliberate (the JS had no bound): two
/// streams of this, base64, fit the longest answer line plimsolld reads (agent.rs MAX_LINE,
/// about 22 MiB); plimsolld asks for 64 KiB.
pub const SNIPPET_CAP_MAX: usize = 8 << 20;

/// `Math.max(0, Number(v) || 0)` as whole units.
fn whole(value: Option<&Value>) -> f64 {
    let n = env::js_number(value);
    if n.is_nan() || n <= 0.0 {
        0.0
    } else {
        n.floor()
    }
}

/// Runs one snippet; the request's env pairs are `NAME=value` (a name must not be empty).
pub fn snippet(
    guest: u32,
    code: &[u8],
    pairs: &[String],
    timeout_ms: Option<&Value>,
    cap: Option<&Value>,
) -> Ran {
    let mut env = Env::base(guest);
    for pair in pairs {
        if let Some((name, value)) = pair.split_once('=')
            && !name.is_empty()
        {
            env.set(name, Value::from(value));
        }
    }
    // Bounded above by SNIPPET_CAP_MAX: the cast is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let cap = whole(cap).min(SNIPPET_CAP_MAX as f64) as usize;
    let mut cmd = Command::new("sh");
    cmd.args(["-c", SNIPPET_SCRIPT, "sh", "node", "-"])
        .env_clear()
        .envs(env.strings())
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .uid(guest)
        .gid(guest)
        .process_group(0);
    let watch = Watch {
        guest,
        deadline: child::after(Instant::now(), whole(timeout_ms)),
        cap: Cap::Each(cap),
        group: true,
        kill_on_exit: false,
        grace: child::PIPE_GRACE,
    };
    match child::run(&mut cmd, Some(code), &watch) {
        Ok(mut ran) => {
            if ran.timed_out {
                ran.exit = EXIT_TIMED_OUT;
            }
            ran
        }
        Err(_) => Ran {
            exit: EXIT_NOT_STARTED,
            ..Ran::default()
        },
    }
}

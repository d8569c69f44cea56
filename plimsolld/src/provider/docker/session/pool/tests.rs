#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;

use super::*;
use crate::config::Config;
use crate::provider::config::ProviderConfig;
use crate::provider::docker::Docker;

#[test]
fn a_hint_is_the_hinted_languages_the_image_runs() {
    let image: LanguageSet = vec!["javascript".into(), "python".into()];
    assert_eq!(
        hint_set(&["python".into()], &image),
        vec!["python".to_owned()]
    );
    assert_eq!(hint_set(&[], &image), image);
    assert_eq!(hint_set(&["ruby".into()], &image), image);
}

/// A docker provider whose Engine is the Unix socket at `socket` (nothing is connected yet).
fn provider(socket: &Path) -> Docker {
    let env: HashMap<String, String> = [
        ("SANDBOX_PROVIDER", "docker".to_owned()),
        ("PLIMSOLL_INSECURE", "1".to_owned()),
        ("DOCKER_HOST", format!("unix://{}", socket.display())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let config = Config::from_env(&env).unwrap();
    let ProviderConfig::Docker(docker) = &config.provider else {
        panic!("a docker configuration");
    };
    Docker::new(docker, &config).unwrap()
}

/// The log lines written on this thread, each with the (paused) clock's time it was written.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<(Instant, String)>>>);

impl Lines {
    /// When each line containing `text` was written.
    fn times_of(&self, text: &str) -> Vec<Instant> {
        let lines = self.0.lock().unwrap();
        lines
            .iter()
            .filter(|(_, line)| line.contains(text))
            .map(|(at, _)| *at)
            .collect()
    }
}

/// One line being written.
struct Line(Lines, Vec<u8>);

impl std::io::Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.1.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.1).into_owned();
        self.0.0.lock().unwrap().push((Instant::now(), text));
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        Line(self.clone(), Vec::new())
    }
}

/// A filler whose makes keep failing (no docker at its socket) waits its backoff between
/// them, 1 s then doubling: its own failed make does not wake it (it did, through the
/// make's end, and a lasting failure was a loop of makes), nor does a removal; the drain
/// still ends the wait at once.
#[tokio::test(start_paused = true)]
async fn failed_makes_are_a_backoff_apart_and_the_drain_ends_the_wait() {
    let lines = Lines::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(lines.clone())
        .with_ansi(false)
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);
    let dir = tempfile::tempdir().unwrap();
    let docker = provider(&dir.path().join("absent.sock"));
    let (inner, pool) = (&docker.inner, Arc::clone(&docker.inner.session_pool));
    {
        let mut state = pool.state();
        state.sizing = Some(Sizing {
            size: 1,
            max_lifetime: Duration::from_secs(60),
        });
        state.demand = Some(Demand::new(1));
    }
    let failed = "a member could not be made";
    let task = tokio::spawn(fill(Arc::clone(&pool), Arc::clone(inner)));
    *pool.filler.lock().unwrap() = Some(task);
    // While no time passes, one make fails and the filler waits.
    for _ in 0..2000 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        lines.times_of(failed).len(),
        1,
        "one failed make, then a wait"
    );
    // A claim or a removal mid-wait (each wakes the filler) does not cut the wait short.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pool.wake.notify_one();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let times = lines.times_of(failed);
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(
        gaps,
        [1, 2, 4].map(Duration::from_secs),
        "makes at 0, 1, 3 and 7 s"
    );
    // The drain ends the 8 s wait now.
    let draining = Instant::now();
    pool.drain(Duration::from_secs(30)).await;
    assert!(
        draining.elapsed() < Duration::from_secs(1),
        "the drain waited {:?} (the filler was waiting since {:?})",
        draining.elapsed(),
        started.elapsed()
    );
    assert!(pool.filler.lock().unwrap().is_none());
    assert_eq!(lines.times_of(failed).len(), 4);
}

/// A start abandoned at its budget (the daemon's timeout drops it) while its first make waits
/// on a docker that never answers: the make goes on, counted, ends by itself (preflight's
/// 10 s bound) and is then no longer counted, so the drain that follows finds the pool empty.
/// Before, the dropped make left `busy` at 1 for good (and its container, had one been made,
/// until its expiry label).
#[tokio::test(start_paused = true)]
async fn a_start_abandoned_at_its_budget_leaves_nothing_counted() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    // Connections are taken (the backlog) and never answered.
    let _silent = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let docker = provider(&socket);
    let (inner, pool) = (&docker.inner, Arc::clone(&docker.inner.session_pool));
    let started = tokio::time::timeout(
        Duration::from_secs(1),
        pool.start(inner, 1, Duration::from_secs(60)),
    )
    .await;
    assert!(started.is_err(), "the start was abandoned: {started:?}");
    assert_eq!(pool.state().busy, 1, "the first make still counts");
    let draining = Instant::now();
    pool.drain(Duration::from_secs(60)).await;
    assert_eq!(pool.state().busy, 0, "nothing counts once the make ended");
    assert!(
        draining.elapsed() < Duration::from_secs(30),
        "the drain waited for the make, not its whole budget: {:?}",
        draining.elapsed()
    );
}

//! The relay's two listeners, the pairing between them, and the words it prints.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::args::Args;
use crate::pairing::{Arrival, MAX_WAITING_GUESTS, Pairing};
use crate::protocol::{NEED, READY};

/// Why the relay could not serve.
#[derive(Debug)]
pub enum ServeError {
    /// The down side's socket could not be made (it exists, or its directory is not writable).
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The up side's port could not be bound (another process holds it).
    Port { port: u16, source: std::io::Error },
    /// stdout is gone: nobody reads what the relay needs.
    Stdout(std::io::Error),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Socket { path, source } => {
                write!(f, "cannot listen on {}: {source}", path.display())
            }
            ServeError::Port { port, source } => {
                write!(f, "cannot listen on 127.0.0.1:{port}: {source}")
            }
            ServeError::Stdout(source) => write!(f, "cannot write to stdout: {source}"),
        }
    }
}

type Waiting = Pairing<UnixStream, TcpStream>;

/// Serves until stdin ends (or the process is killed).
pub async fn serve(args: Args) -> Result<(), ServeError> {
    // The down side first: binding fails when the path exists, so a file planted there
    // earlier is never taken over.
    let down = UnixListener::bind(&args.socket).map_err(|source| ServeError::Socket {
        path: args.socket.clone(),
        source,
    })?;
    let up = TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(|source| ServeError::Port {
            port: args.port,
            source,
        })?;
    let (words, said) = mpsc::channel::<&'static str>(MAX_WAITING_GUESTS);
    let speaker = tokio::spawn(speak(said));
    words
        .send(READY)
        .await
        .map_err(|_| ServeError::Stdout(std::io::ErrorKind::BrokenPipe.into()))?;
    let waiting: Arc<Mutex<Waiting>> = Arc::default();
    let mut stdin = tokio::io::stdin();
    let mut sink = [0u8; 512];
    loop {
        tokio::select! {
            read = stdin.read(&mut sink) => {
                // End of stdin (or a broken one): plimsolld is done with this run.
                if matches!(read, Ok(0) | Err(_)) {
                    break;
                }
            }
            accepted = down.accept() => {
                let Ok((guest, _)) = accepted else { continue };
                let arrival = lock(&waiting).guest(guest);
                match arrival {
                    Arrival::Paired(guest, dial) => join(guest, dial),
                    // A full channel only slows accepting; the word is never dropped.
                    Arrival::GuestWaits => {
                        if words.send(NEED).await.is_err() {
                            break;
                        }
                    }
                    Arrival::DialParked | Arrival::Refused => {}
                }
            }
            accepted = up.accept() => {
                let Ok((dial, _)) = accepted else { continue };
                let _ = dial.set_nodelay(true);
                let arrival = lock(&waiting).dial(dial);
                if let Arrival::Paired(guest, dial) = arrival {
                    join(guest, dial);
                }
            }
        }
    }
    drop(words);
    let _ = std::fs::remove_file(&args.socket);
    match speaker.await {
        Ok(Err(e)) => Err(ServeError::Stdout(e)),
        _ => Ok(()),
    }
}

fn lock(waiting: &Mutex<Waiting>) -> std::sync::MutexGuard<'_, Waiting> {
    // The lock guards two queues and no invariant spans a panic; keep serving.
    waiting
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Copies between a guest and a dial until both directions end (each side's end is passed
/// on as a half-close).
fn join(mut guest: UnixStream, mut dial: TcpStream) {
    tokio::spawn(async move {
        let _ = tokio::io::copy_bidirectional(&mut guest, &mut dial).await;
    });
}

/// Writes each word on its own line, flushed at once.
async fn speak(mut said: mpsc::Receiver<&'static str>) -> std::io::Result<()> {
    let mut out = tokio::io::stdout();
    while let Some(word) = said.recv().await {
        out.write_all(format!("{word}\n").as_bytes()).await?;
        out.flush().await?;
    }
    Ok(())
}

//! The cell relay (providers.md §9.6): `plimsoll-relay cell <kernel dir> <work dir>`, one per
//! live interpreter of a session, started by the daemon over the provider's exec and held
//! there: its stdin and stdout are the daemon's, one JSON object a line each way.
//!
//! Its first line is `{"ready":"pid:starttime:cmdlinehex"}`. Per cell, every frame carries the
//! cell's nonce as `n`:
//!
//! ```text
//! prepare {"nonce","files":[{path,content}]} -> {"n","prepared":true}
//!         | {"n","done":3,"file":i,"errno":"E…"}   a file could not be written: nothing ran
//!         | {"n","done":75}                         no interpreter listens: nothing ran
//! run     {"nonce","code","outCap","errCap"}     -> {"n","o":b64} / {"n","e":b64} pieces of at
//!         most 48 KiB, then {"n","done":0|1|76,"ot","et"} (ran / raised / interpreter gone)
//! ```
//!
//! It reads the kernel's stdout and stderr FIFOs for its whole life and forwards only the bytes
//! between the current cell's start and end markers; anything written between cells is
//! dropped. Any message it cannot accept ends it with exit 2 (the daemon then treats the
//! interpreter as lost); the end of stdin ends it with 0.
//!
//! It replaces a Node program that spoke the same lines, at a tenth of its memory. That one ran
//! under the runner guard (an `LD_PRELOAD` library making it non-dumpable); a static binary
//! ignores `LD_PRELOAD`, so `main` makes the process non-dumpable itself before anything else
//! (no session process of the same uid may trace it or open its memory).
//!
//! The files: [`message`] (the lines), [`files`] (writes under the work directory),
//! [`stream`] (markers and caps), [`relay`] (the decisions, without I/O), [`serve`] (the I/O),
//! [`identity`] (`pid:starttime:cmdlinehex`).

pub mod files;
pub mod identity;
pub mod message;
pub mod relay;
pub mod serve;
pub mod stream;

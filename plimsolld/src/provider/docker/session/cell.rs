//! Cells on docker: the provider-neutral machinery ([`crate::provider::guest::cell`]) over
//! `docker exec` ([`ContainerExec`]), laid out the docker way ([`layout`]): cells in `/work` as
//! the guest uid, the interpreter started through the start script with the verified image
//! environment (providers.md §5.5), the identity check as uid+1, an identity no session process
//! has.

#[cfg(test)]
mod tests;

pub use crate::provider::guest::cell::{CellError, CellLanguage, Interpreter, Layout};
use crate::provider::guest::cell::{CellRelay, RELAY_BINARY};

use std::sync::Arc;

use super::super::engine::Engine;
use super::super::guest::ContainerExec;
use super::super::lockdown::START_SCRIPT;
use crate::provider::guest::GuestExec;
use crate::provider::guest::cells::Target;
use crate::provider::guest::outcome::GUARD;

/// Where cells run and files land in a docker session.
pub const WORK: &str = "/work";

/// Who the guest processes run as, and the environment the image asked for.
#[derive(Debug, Clone)]
pub struct Guest {
    /// The guest uid (also the gid); uid+1 is the checker identity.
    pub uid: u32,
    /// The verified image `Config.Env`, as `NAME=value` entries (providers.md §5.5).
    pub image_env: Vec<String>,
}

// === impl Guest ===

impl Guest {
    /// `uid:gid` of the guest.
    pub fn user(&self) -> String {
        format!("{0}:{0}", self.uid)
    }

    /// `uid:gid` of the checker (uid+1).
    pub fn checker_user(&self) -> String {
        let checker = self.uid.saturating_add(1);
        format!("{checker}:{checker}")
    }
}

/// The docker layout for `guest`, with a fresh start marker.
pub fn layout(guest: &Guest) -> Layout {
    let marker = format!(
        "plimsoll-started:{}",
        hex::encode(rand::random::<[u8; 8]>())
    );
    let mut prefix = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        START_SCRIPT.to_owned(),
        "sh".to_owned(),
        marker,
    ];
    prefix.extend(guest.image_env.iter().cloned());
    prefix.push(format!("LD_PRELOAD={GUARD}"));
    Layout {
        work: WORK.to_owned(),
        user: guest.user(),
        checker: crate::provider::guest::cell::Checker::User(guest.checker_user()),
        interpreter_prefix: prefix,
        guard: Some(GUARD.to_owned()),
        relay_parent: crate::provider::guest::cell::RelayParent::Outside,
        relay: CellRelay::Binary(RELAY_BINARY.to_owned()),
    }
}

/// Where `guest`'s interpreters run in `container`.
pub fn target(engine: &Engine, container: &str, guest: &Guest) -> Target {
    let exec: Arc<dyn GuestExec> = Arc::new(ContainerExec::new(engine, container));
    (exec, layout(guest))
}

//! Isolation tiers and floors.
//!
//! A tier says how strong the wall around a run is, weakest first: `none`,
//! `process`, `container`, `kernel`, `vm`. Every answer is painted with the tier
//! the daemon proved; a caller's floor (`minimum_isolation`) refuses any run
//! that would execute below it.

use std::fmt;

/// An isolation tier, weakest first. The derived order is the tier order.
///
/// `None` is only ever a provider's tier (the `disabled` provider runs nothing);
/// it is never an acceptable floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IsolationTier {
    /// No sandbox: nothing runs (the `disabled` provider).
    None,
    /// In-process isolation (the `wasm` provider).
    Process,
    /// A container sharing the host kernel (docker under runc, openshell).
    Container,
    /// A user-space kernel between guest and host (docker under gVisor runsc).
    Kernel,
    /// A hardware virtual machine (e2b, dockercloud).
    Vm,
}

impl IsolationTier {
    /// Every tier, weakest first.
    pub const ALL: [IsolationTier; 5] = [
        IsolationTier::None,
        IsolationTier::Process,
        IsolationTier::Container,
        IsolationTier::Kernel,
        IsolationTier::Vm,
    ];

    /// The tier's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            IsolationTier::None => "none",
            IsolationTier::Process => "process",
            IsolationTier::Container => "container",
            IsolationTier::Kernel => "kernel",
            IsolationTier::Vm => "vm",
        }
    }

    /// Reads a tier from an answer. An empty or unknown string is `None` here
    /// (the caller gets no tier), which [`Floor::is_met_by_wire`] treats as
    /// meeting no floor.
    pub fn from_wire(s: &str) -> Option<IsolationTier> {
        IsolationTier::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl fmt::Display for IsolationTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a floor string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "minimum_isolation {given:?} is not a floor: use \"\" (none), process, container, kernel or vm"
)]
pub struct FloorError {
    /// The string that was given.
    pub given: String,
}

/// The weakest tier a caller accepts: no floor, or one of `process`,
/// `container`, `kernel`, `vm`.
///
/// `none` is refused as a floor: it would state a requirement that every
/// answer meets, which is only ever a caller's mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Floor(Option<IsolationTier>);

impl Floor {
    /// No floor: every tier is accepted.
    pub const NONE: Floor = Floor(None);

    /// Parses a request's `minimum_isolation` exactly (no trimming, no case
    /// folding): `""` is no floor; `process`, `container`, `kernel` and `vm` are
    /// floors; anything else, `none` included, is an error.
    pub fn parse(s: &str) -> Result<Floor, FloorError> {
        match IsolationTier::from_wire(s) {
            _ if s.is_empty() => Ok(Floor(None)),
            Some(IsolationTier::None) | None => Err(FloorError {
                given: s.to_owned(),
            }),
            Some(tier) => Ok(Floor(Some(tier))),
        }
    }

    /// The floor's tier, if there is one.
    pub fn tier(self) -> Option<IsolationTier> {
        self.0
    }

    /// Whether `tier` meets this floor.
    pub fn is_met_by(self, tier: IsolationTier) -> bool {
        self.0.is_none_or(|floor| tier >= floor)
    }

    /// Whether a tier as written in an answer meets this floor. An empty or
    /// unknown string meets no floor.
    pub fn is_met_by_wire(self, tier: &str) -> bool {
        match IsolationTier::from_wire(tier) {
            Some(t) => self.is_met_by(t),
            None => self.0.is_none(),
        }
    }

    /// The stronger of two floors (a session's floor and a call's own).
    pub fn stronger(self, other: Floor) -> Floor {
        Floor(self.0.max(other.0))
    }
}

impl fmt::Display for Floor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.map_or("", IsolationTier::as_str))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_are_ordered_weakest_first() {
        let all = IsolationTier::ALL;
        for pair in all.windows(2) {
            assert!(pair[0] < pair[1], "{} should be below {}", pair[0], pair[1]);
        }
    }

    #[test]
    fn every_tier_round_trips_through_its_wire_name() {
        for t in IsolationTier::ALL {
            assert_eq!(IsolationTier::from_wire(t.as_str()), Some(t));
        }
        assert_eq!(IsolationTier::from_wire(""), None);
        assert_eq!(IsolationTier::from_wire("VM"), None);
        assert_eq!(IsolationTier::from_wire("unknown"), None);
    }

    #[test]
    fn none_and_unknown_floors_are_refused() {
        for bad in ["none", "unknown", "Process", " vm", "vm ", "gvisor"] {
            let err = Floor::parse(bad).expect_err(bad);
            assert_eq!(err.given, bad);
        }
    }

    #[test]
    fn empty_floor_accepts_every_tier() {
        let floor = Floor::parse("").expect("empty floor");
        assert_eq!(floor, Floor::NONE);
        for t in IsolationTier::ALL {
            assert!(floor.is_met_by(t));
        }
    }

    #[test]
    fn floor_is_met_only_at_or_above_its_tier() {
        let floor = Floor::parse("container").expect("container floor");
        assert!(!floor.is_met_by(IsolationTier::None));
        assert!(!floor.is_met_by(IsolationTier::Process));
        assert!(floor.is_met_by(IsolationTier::Container));
        assert!(floor.is_met_by(IsolationTier::Kernel));
        assert!(floor.is_met_by(IsolationTier::Vm));
    }

    #[test]
    fn empty_or_unknown_answer_tier_meets_no_floor() {
        let floor = Floor::parse("process").expect("process floor");
        assert!(!floor.is_met_by_wire(""));
        assert!(!floor.is_met_by_wire("unknown"));
        assert!(floor.is_met_by_wire("vm"));
        assert!(Floor::NONE.is_met_by_wire(""));
    }

    #[test]
    fn stronger_floor_wins() {
        let p = Floor::parse("process").expect("process");
        let k = Floor::parse("kernel").expect("kernel");
        assert_eq!(p.stronger(k), k);
        assert_eq!(Floor::NONE.stronger(p), p);
        assert_eq!(Floor::NONE.stronger(Floor::NONE), Floor::NONE);
    }
}

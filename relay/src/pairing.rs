//! Which guest connection goes with which dialled-in connection: first come, first served
//! on both sides, with a bound on how many may wait.
//!
//! A guest connection that finds a dialled-in one waiting is paired at once; otherwise it
//! waits, and the relay prints `need`. A dialled-in connection that finds a guest waiting is
//! paired at once; otherwise it parks (a guest that gave up left its dial behind). Past the
//! bounds a new connection is refused (closed): the guest's own code can open connections
//! without end, and nothing it does may grow the relay without bound.

use std::collections::VecDeque;

/// The most guest connections that may wait for a dial.
pub const MAX_WAITING_GUESTS: usize = 256;
/// The most dialled-in connections that may wait for a guest.
pub const MAX_PARKED_DIALS: usize = 32;

/// The waiting connections of both sides.
#[derive(Debug)]
pub struct Pairing<G, U> {
    guests: VecDeque<G>,
    dials: VecDeque<U>,
}

/// What became of an arriving connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival<G, U> {
    /// Joined with a connection of the other side: copy between them.
    Paired(G, U),
    /// A guest now waits: print `need`.
    GuestWaits,
    /// A dial now waits for a guest.
    DialParked,
    /// Over the bound: close it.
    Refused,
}

impl<G, U> Default for Pairing<G, U> {
    fn default() -> Self {
        Pairing {
            guests: VecDeque::new(),
            dials: VecDeque::new(),
        }
    }
}

impl<G, U> Pairing<G, U> {
    /// A guest connection arrived on the down side.
    pub fn guest(&mut self, guest: G) -> Arrival<G, U> {
        if let Some(dial) = self.dials.pop_front() {
            return Arrival::Paired(guest, dial);
        }
        if self.guests.len() >= MAX_WAITING_GUESTS {
            return Arrival::Refused;
        }
        self.guests.push_back(guest);
        Arrival::GuestWaits
    }

    /// A dialled-in connection arrived on the up side.
    pub fn dial(&mut self, dial: U) -> Arrival<G, U> {
        if let Some(guest) = self.guests.pop_front() {
            return Arrival::Paired(guest, dial);
        }
        if self.dials.len() >= MAX_PARKED_DIALS {
            return Arrival::Refused;
        }
        self.dials.push_back(dial);
        Arrival::DialParked
    }

    /// How many guests wait.
    pub fn waiting_guests(&self) -> usize {
        self.guests.len()
    }

    /// How many dials are parked.
    pub fn parked_dials(&self) -> usize {
        self.dials.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_side_is_served_first_come_first_served() {
        let mut p = Pairing::<u32, &str>::default();
        assert_eq!(p.guest(1), Arrival::GuestWaits);
        assert_eq!(p.guest(2), Arrival::GuestWaits);
        assert_eq!(p.dial("a"), Arrival::Paired(1, "a"));
        assert_eq!(p.dial("b"), Arrival::Paired(2, "b"));
        assert_eq!(p.dial("c"), Arrival::DialParked);
        assert_eq!(p.guest(3), Arrival::Paired(3, "c"));
        assert_eq!((p.waiting_guests(), p.parked_dials()), (0, 0));
    }

    #[test]
    fn neither_side_grows_past_its_bound() {
        let mut p = Pairing::<usize, usize>::default();
        for i in 0..MAX_WAITING_GUESTS {
            assert_eq!(p.guest(i), Arrival::GuestWaits);
        }
        assert_eq!(p.guest(9999), Arrival::Refused);
        assert_eq!(p.waiting_guests(), MAX_WAITING_GUESTS);
        let mut q = Pairing::<usize, usize>::default();
        for i in 0..MAX_PARKED_DIALS {
            assert_eq!(q.dial(i), Arrival::DialParked);
        }
        assert_eq!(q.dial(9999), Arrival::Refused);
    }
}

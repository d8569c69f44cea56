//! The gateway's clock: the host's, shifted by a skew the tests set, so a client that
//! measures the gateway's clock (plimsoll's orphan rule) sees a gateway running ahead or
//! behind. Every timestamp the simulator hands out comes from here.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, Default)]
pub struct Clock {
    skew_ms: AtomicI64,
}

impl Clock {
    /// Shifts the gateway's clock: positive runs ahead of the host, negative behind.
    pub fn set_skew_ms(&self, skew_ms: i64) {
        self.skew_ms.store(skew_ms, Ordering::Relaxed);
    }

    pub fn skew_ms(&self) -> i64 {
        self.skew_ms.load(Ordering::Relaxed)
    }

    /// Now on the gateway's clock, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        let host = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis();
        i64::try_from(host)
            .unwrap_or(i64::MAX)
            .saturating_add(self.skew_ms())
    }

    /// Now on the gateway's clock as a protobuf timestamp.
    pub fn now(&self) -> prost_types::Timestamp {
        timestamp(self.now_ms())
    }
}

/// A protobuf timestamp for milliseconds since the Unix epoch.
pub fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        // In 0..1000 ms, so the nanoseconds fit.
        nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skew_moves_the_gateway_clock() {
        let clock = Clock::default();
        let before = clock.now_ms();
        clock.set_skew_ms(3_600_000);
        let ahead = clock.now_ms();
        assert!(ahead - before >= 3_600_000 && ahead - before < 3_660_000);
    }

    #[test]
    fn timestamps_split_seconds_and_nanos() {
        let t = timestamp(1_500);
        assert_eq!((t.seconds, t.nanos), (1, 500_000_000));
        let t = timestamp(-1);
        assert_eq!((t.seconds, t.nanos), (-1, 999_000_000));
    }
}

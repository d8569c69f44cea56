//! The step grid: the times a model is stepped to between 0 and `end_time`.
//!
//! A row takes [`step_count`] steps. Step `k` (from 0) starts at `t = k × step` and ends at
//! `(k + 1) × step`, except the last, which ends exactly at `end_time`. When `end_time` is a
//! whole number of steps up to rounding (`0.3 / 0.1` is `2.9999999999999996`), the last step
//! is that last whole step, not a sliver; otherwise it is the shorter remainder. So a row has
//! at most `floor(end_time / step) + 1` steps, which is what the wire's budget rule allows for
//! (wire.md §6.5 counts `floor(end_time / step) + 2` values per row).

/// How close `end_time / step` must be to a whole number to count as one, relative.
const WHOLE: f64 = 1e-9;

/// The number of steps from 0 to `end_time` (at least 1).
///
/// Both values must be finite and above 0 (the wire refuses anything else); for other values
/// the answer is 1 or saturates and means nothing.
pub fn step_count(end_time: f64, step: f64) -> u64 {
    let ratio = end_time / step;
    let nearest = ratio.round();
    let steps = if (ratio - nearest).abs() <= WHOLE * nearest.max(1.0) {
        nearest
    } else {
        ratio.ceil()
    };
    // `as` saturates: a ratio past u64 (never admitted) stays a huge count, never wraps.
    (steps as u64).max(1)
}

/// One run's grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    end_time: f64,
    step: f64,
    steps: u64,
}

impl Grid {
    /// The grid from 0 to `end_time` in steps of `step`.
    pub fn new(end_time: f64, step: f64) -> Grid {
        Grid {
            end_time,
            step,
            steps: step_count(end_time, step),
        }
    }

    /// How many steps a row takes.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The time after step `k` (`k` from 0): where the outputs recorded for it stand.
    pub fn time_after(&self, k: u64) -> f64 {
        if k + 1 >= self.steps {
            self.end_time
        } else {
            (k + 1) as f64 * self.step
        }
    }

    /// Step `k`'s start and length.
    pub fn interval(&self, k: u64) -> (f64, f64) {
        let start = k as f64 * self.step;
        (start, self.time_after(k) - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_ratios_up_to_rounding_take_that_many_steps() {
        assert_eq!(step_count(1.0, 0.1), 10);
        assert_eq!(step_count(0.3, 0.1), 3);
        assert_eq!(step_count(1.0, 1.0), 1);
        assert_eq!(step_count(10.0, 0.001), 10_000);
    }

    #[test]
    fn a_remainder_is_one_shorter_last_step() {
        assert_eq!(step_count(1.05, 0.1), 11);
        assert_eq!(step_count(0.5, 1.0), 1);
        assert_eq!(step_count(1e-12, 1.0), 1);
        let grid = Grid::new(1.05, 0.1);
        let (start, length) = grid.interval(10);
        assert_eq!(start, 1.0);
        assert!((length - 0.05).abs() < 1e-12);
        assert_eq!(grid.time_after(10), 1.05);
    }

    #[test]
    fn the_last_step_ends_exactly_at_end_time_and_every_step_is_positive() {
        for (end, step) in [
            (0.3, 0.1),
            (1.0, 0.1),
            (7.0, 0.7),
            (100.0, 0.03),
            (2.0, 3.0),
        ] {
            let grid = Grid::new(end, step);
            assert_eq!(grid.time_after(grid.steps() - 1), end);
            for k in 0..grid.steps() {
                let (start, length) = grid.interval(k);
                assert!(length > 0.0, "{end}/{step} step {k}: {start} + {length}");
                assert!(grid.time_after(k) > start, "{end}/{step} step {k}");
            }
        }
    }

    #[test]
    fn steps_never_exceed_what_the_wire_budget_allows() {
        let mut x = 0.123_456_789_f64;
        for _ in 0..10_000 {
            // A cheap deterministic spread of ratios across many magnitudes.
            x = (x * 7.389_056_098_930_65).fract() + 1e-3;
            let (end, step) = (x * 1000.0, x.sqrt());
            let ratio = end / step;
            assert!(
                step_count(end, step) <= ratio.floor() as u64 + 1,
                "{end}/{step}"
            );
            assert!(step_count(end, step) >= 1);
        }
    }
}

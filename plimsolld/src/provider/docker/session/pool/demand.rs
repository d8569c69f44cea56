//! Which language sets the warm pool keeps (providers.md §9.8): below [`HINTED_FROM`] members
//! every member warms every language; from there on, demand is a decaying weight per hinted
//! language set, the refill warms the set furthest below its share, and a rebalance may
//! replace a member of a set well above its share.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// A language set: the languages a member warms, sorted, without repeats.
pub type LanguageSet = Vec<String>;

/// The pool size from which members warm only the languages opens ask for.
pub const HINTED_FROM: u32 = 5;
/// The least time between two rebalancing removals (at most one container start a minute).
pub const REBALANCE_EVERY: Duration = Duration::from_secs(60);
/// How far the largest deficit plus the largest surplus must go before a rebalance.
const REBALANCE_GAP: f64 = 1.75;

/// The demand per language set.
#[derive(Debug, Clone)]
pub struct Demand {
    size: u32,
    weights: BTreeMap<LanguageSet, f64>,
}

impl Demand {
    /// No demand yet, for a pool of `size` members.
    pub fn new(size: u32) -> Demand {
        Demand {
            size,
            weights: BTreeMap::new(),
        }
    }

    /// Whether members warm hinted sets rather than every language.
    pub fn hinted(&self) -> bool {
        self.size >= HINTED_FROM
    }

    /// Each open's step: `min(1/16, 1/(4 × size))`.
    fn rate(&self) -> f64 {
        (1.0_f64 / 16.0).min(1.0 / (4.0 * f64::from(self.size.max(1))))
    }

    /// One open asked for `set`: every weight decays, `set` gains the rate, and a set that
    /// fell below a quarter of the rate is forgotten.
    pub fn count(&mut self, set: &LanguageSet) {
        let rate = self.rate();
        for weight in self.weights.values_mut() {
            *weight *= 1.0 - rate;
        }
        *self.weights.entry(set.clone()).or_insert(0.0) += rate;
        self.weights.retain(|_, w| *w >= rate / 4.0);
    }

    /// Each remembered set's share of the pool: `size × weight / total`.
    fn shares(&self) -> BTreeMap<&LanguageSet, f64> {
        let total: f64 = self.weights.values().sum();
        if total <= 0.0 {
            return BTreeMap::new();
        }
        self.weights
            .iter()
            .map(|(set, w)| (set, f64::from(self.size) * w / total))
            .collect()
    }

    /// The set the next member warms, given how many members each set `held` has; `None`
    /// means every language (a small pool, or no demand yet).
    pub fn refill(&self, held: &BTreeMap<LanguageSet, u32>) -> Option<LanguageSet> {
        if !self.hinted() {
            return None;
        }
        self.shares()
            .into_iter()
            .map(|(set, share)| (set, share - count(held, set)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(set, _)| set.clone())
    }

    /// The set whose oldest member a rebalance removes now, if any: only when some set is
    /// below its share, the largest deficit plus the largest surplus exceed 1.75, the last
    /// move was at least [`REBALANCE_EVERY`] ago, and the surplus set holds under a quarter
    /// of the weight.
    pub fn rebalance(
        &self,
        held: &BTreeMap<LanguageSet, u32>,
        last_move: Option<Instant>,
        now: Instant,
    ) -> Option<LanguageSet> {
        if !self.hinted() || last_move.is_some_and(|at| now.duration_since(at) < REBALANCE_EVERY) {
            return None;
        }
        let shares = self.shares();
        let deficit = shares
            .iter()
            .map(|(set, share)| share - count(held, set))
            .fold(0.0_f64, f64::max);
        if deficit <= 0.0 {
            return None;
        }
        let total: f64 = self.weights.values().sum();
        let (surplus_set, surplus) = held
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(set, n)| (set, f64::from(*n) - shares.get(set).copied().unwrap_or(0.0)))
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        let weight = self.weights.get(surplus_set).copied().unwrap_or(0.0);
        (surplus > 0.0 && deficit + surplus > REBALANCE_GAP && weight < total / 4.0)
            .then(|| surplus_set.clone())
    }

    /// The remembered sets and their weights, for tests and the log.
    #[cfg(test)]
    fn weight(&self, set: &LanguageSet) -> f64 {
        self.weights.get(set).copied().unwrap_or(0.0)
    }
}

fn count(held: &BTreeMap<LanguageSet, u32>, set: &LanguageSet) -> f64 {
    f64::from(held.get(set).copied().unwrap_or(0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> LanguageSet {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn held(pairs: &[(&[&str], u32)]) -> BTreeMap<LanguageSet, u32> {
        pairs.iter().map(|(s, n)| (set(s), *n)).collect()
    }

    #[test]
    fn a_small_pool_warms_every_language_whatever_the_demand() {
        let mut d = Demand::new(4);
        d.count(&set(&["python"]));
        assert_eq!(d.refill(&held(&[])), None);
        assert_eq!(
            d.rebalance(
                &held(&[(&["javascript", "python"], 4)]),
                None,
                Instant::now()
            ),
            None
        );
    }

    #[test]
    fn weights_decay_by_the_rate_and_small_ones_are_forgotten() {
        // size 8: rate = min(1/16, 1/32) = 1/32.
        let mut d = Demand::new(8);
        let py = set(&["python"]);
        let js = set(&["javascript"]);
        d.count(&py);
        assert!((d.weight(&py) - 1.0 / 32.0).abs() < 1e-12);
        d.count(&js);
        assert!((d.weight(&py) - (1.0 / 32.0) * (31.0 / 32.0)).abs() < 1e-12);
        // Python falls below rate/4 after enough JavaScript opens.
        for _ in 0..200 {
            d.count(&js);
        }
        assert_eq!(d.weight(&py), 0.0);
        assert!(d.weight(&js) > 0.0);
    }

    #[test]
    fn the_refill_warms_the_set_furthest_below_its_share() {
        let mut d = Demand::new(5);
        assert_eq!(d.refill(&held(&[])), None, "no demand yet: every language");
        let py = set(&["python"]);
        let js = set(&["javascript"]);
        for _ in 0..3 {
            d.count(&py);
        }
        d.count(&js);
        // Python holds most of the weight; with one python member and none for JavaScript,
        // python (share about 3.6) is still further below than JavaScript (about 1.4).
        assert_eq!(d.refill(&held(&[(&["python"], 1)])), Some(py.clone()));
        assert_eq!(d.refill(&held(&[(&["python"], 3)])), Some(js));
    }

    #[test]
    fn a_rebalance_needs_a_gap_a_quiet_minute_and_a_light_surplus_set() {
        let mut d = Demand::new(5);
        let py = set(&["python"]);
        d.count(&py);
        let all = held(&[(&["javascript", "python"], 4)]);
        let now = Instant::now();
        // Deficit 5 (python) + surplus 4 (every-language, no weight): remove one.
        assert_eq!(
            d.rebalance(&all, None, now),
            Some(set(&["javascript", "python"]))
        );
        // Not twice within a minute.
        assert_eq!(
            d.rebalance(&all, Some(now), now + Duration::from_secs(59)),
            None
        );
        assert!(
            d.rebalance(&all, Some(now), now + Duration::from_secs(60))
                .is_some()
        );
        // Balanced: nothing moves.
        assert_eq!(d.rebalance(&held(&[(&["python"], 5)]), None, now), None);
        // A surplus set that holds a quarter of the weight or more stays.
        let mut even = Demand::new(5);
        let js = set(&["javascript"]);
        even.count(&py);
        even.count(&js);
        assert_eq!(
            even.rebalance(&held(&[(&["javascript"], 5)]), None, now),
            None
        );
    }
}

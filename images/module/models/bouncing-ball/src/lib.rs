//! `bouncing-ball`: a ball under constant gravity that bounces off the floor at height 0.
//!
//! | | |
//! |---|---|
//! | parameters | `h0` (≥ 0), `v0` (upward positive), `g` (> 0), `e` (restitution, 0 to 1) |
//! | outputs | `height`, `velocity`, `bounces` (impacts so far, as a number) |
//! | codes | -1 g not above 0; -2 e outside 0 to 1; -3 h0 negative |
//!
//! Flights are exact parabolas, and each impact is located inside the step by solving the
//! flight's quadratic, so outputs do not depend on the step size. At an impact the velocity
//! becomes `-e` times the impact velocity. A rebound slower than [`REST_SPEED`] is not a
//! bounce: the ball stays at rest on the floor from then on (this ends the infinitely many
//! ever shorter bounces the ideal model would make in finite time).

use model_abi::{Model, Step};

/// Below this rebound speed the ball comes to rest.
pub const REST_SPEED: f64 = 1e-6;

pub struct Ball {
    g: f64,
    e: f64,
    height: f64,
    velocity: f64,
    bounces: u64,
    resting: bool,
}

impl Model for Ball {
    const PARAMS: usize = 4;
    const OUTPUTS: usize = 3;

    fn init(p: &[f64]) -> Result<Self, i32> {
        let (h0, v0, g, e) = (p[0], p[1], p[2], p[3]);
        if g <= 0.0 {
            return Err(-1);
        }
        if !(0.0..=1.0).contains(&e) {
            return Err(-2);
        }
        if h0 < 0.0 {
            return Err(-3);
        }
        Ok(Ball {
            g,
            e,
            height: h0,
            velocity: v0,
            bounces: 0,
            resting: false,
        })
    }

    fn step(&mut self, _t: f64, h: f64, out: &mut [f64]) -> Result<Step, i32> {
        let mut left = h;
        while left > 0.0 && !self.resting {
            // The flight's next impact: the positive root of height + v·τ − g·τ²/2 = 0.
            let impact_speed = (self.velocity * self.velocity + 2.0 * self.g * self.height).sqrt();
            let until_impact = (self.velocity + impact_speed) / self.g;
            if until_impact > left {
                self.height += self.velocity * left - 0.5 * self.g * left * left;
                self.velocity -= self.g * left;
                break;
            }
            left -= until_impact;
            self.height = 0.0;
            let rebound = self.e * impact_speed;
            if rebound < REST_SPEED {
                self.velocity = 0.0;
                self.resting = true;
            } else {
                self.velocity = rebound;
                self.bounces += 1;
            }
        }
        out[0] = self.height;
        out[1] = self.velocity;
        out[2] = self.bounces as f64;
        Ok(Step::Continue)
    }
}

model_abi::export_model!(Ball);

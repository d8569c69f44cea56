//! `damped-oscillator`: x'' + 2ζωx' + ω²x = 0.
//!
//! | | |
//! |---|---|
//! | parameters | `omega` (ω > 0, rad per unit time), `zeta` (ζ ≥ 0), `x0`, `v0` |
//! | outputs | `x`, `v` (= x') |
//! | codes | -1 ω not above 0; -2 ζ negative; -3 a step would need over 10 million substeps |
//!
//! Integrated with classic fourth-order Runge-Kutta in equal substeps no longer than
//! `0.01 / (ω·max(1, 2ζ))`, so the error stays near 1e-9 of the amplitude over many periods
//! and heavy damping stays stable.

use model_abi::{Model, Step};

/// The most substeps one step may take.
const MAX_SUBSTEPS: f64 = 1e7;

pub struct Oscillator {
    omega: f64,
    zeta: f64,
    x: f64,
    v: f64,
}

impl Oscillator {
    fn acceleration(&self, x: f64, v: f64) -> f64 {
        -2.0 * self.zeta * self.omega * v - self.omega * self.omega * x
    }

    fn rk4(&mut self, dt: f64) {
        let (x, v) = (self.x, self.v);
        let (k1x, k1v) = (v, self.acceleration(x, v));
        let (x2, v2) = (x + 0.5 * dt * k1x, v + 0.5 * dt * k1v);
        let (k2x, k2v) = (v2, self.acceleration(x2, v2));
        let (x3, v3) = (x + 0.5 * dt * k2x, v + 0.5 * dt * k2v);
        let (k3x, k3v) = (v3, self.acceleration(x3, v3));
        let (x4, v4) = (x + dt * k3x, v + dt * k3v);
        let (k4x, k4v) = (v4, self.acceleration(x4, v4));
        self.x = x + dt / 6.0 * (k1x + 2.0 * k2x + 2.0 * k3x + k4x);
        self.v = v + dt / 6.0 * (k1v + 2.0 * k2v + 2.0 * k3v + k4v);
    }
}

impl Model for Oscillator {
    const PARAMS: usize = 4;
    const OUTPUTS: usize = 2;

    fn init(p: &[f64]) -> Result<Self, i32> {
        let (omega, zeta, x0, v0) = (p[0], p[1], p[2], p[3]);
        if omega <= 0.0 {
            return Err(-1);
        }
        if zeta < 0.0 {
            return Err(-2);
        }
        Ok(Oscillator {
            omega,
            zeta,
            x: x0,
            v: v0,
        })
    }

    fn step(&mut self, _t: f64, h: f64, out: &mut [f64]) -> Result<Step, i32> {
        let longest = 0.01 / (self.omega * f64::max(1.0, 2.0 * self.zeta));
        let substeps = (h / longest).ceil().max(1.0);
        if substeps > MAX_SUBSTEPS {
            return Err(-3);
        }
        let dt = h / substeps;
        for _ in 0..substeps as u64 {
            self.rk4(dt);
        }
        out[0] = self.x;
        out[1] = self.v;
        Ok(Step::Continue)
    }
}

model_abi::export_model!(Oscillator);

//! `lotka-volterra`: prey x and predators y, with x' = αx − βxy and y' = δxy − γy.
//!
//! | | |
//! |---|---|
//! | parameters | `alpha`, `beta`, `delta`, `gamma` (all > 0), `x0`, `y0` (both > 0) |
//! | outputs | `x` (prey), `y` (predators) |
//! | codes | -1 a rate not above 0; -2 a starting population not above 0; -3 the populations stopped being finite; -4 a step would need over 10 million substeps |
//!
//! Integrated with classic fourth-order Runge-Kutta in equal substeps no longer than
//! `0.001 / max(1, α, γ, β·x, δ·y)` (the fastest rate at the step's start). Along an exact
//! orbit `δx − γ ln x + βy − α ln y` is constant.

use model_abi::{Model, Step};

/// The most substeps one step may take.
const MAX_SUBSTEPS: f64 = 1e7;

pub struct LotkaVolterra {
    alpha: f64,
    beta: f64,
    delta: f64,
    gamma: f64,
    x: f64,
    y: f64,
}

impl LotkaVolterra {
    fn rates(&self, x: f64, y: f64) -> (f64, f64) {
        (
            self.alpha * x - self.beta * x * y,
            self.delta * x * y - self.gamma * y,
        )
    }

    fn rk4(&mut self, dt: f64) {
        let (x, y) = (self.x, self.y);
        let k1 = self.rates(x, y);
        let k2 = self.rates(x + 0.5 * dt * k1.0, y + 0.5 * dt * k1.1);
        let k3 = self.rates(x + 0.5 * dt * k2.0, y + 0.5 * dt * k2.1);
        let k4 = self.rates(x + dt * k3.0, y + dt * k3.1);
        self.x = x + dt / 6.0 * (k1.0 + 2.0 * k2.0 + 2.0 * k3.0 + k4.0);
        self.y = y + dt / 6.0 * (k1.1 + 2.0 * k2.1 + 2.0 * k3.1 + k4.1);
    }
}

impl Model for LotkaVolterra {
    const PARAMS: usize = 6;
    const OUTPUTS: usize = 2;

    fn init(p: &[f64]) -> Result<Self, i32> {
        if !p[..4].iter().all(|rate| *rate > 0.0) {
            return Err(-1);
        }
        if p[4] <= 0.0 || p[5] <= 0.0 {
            return Err(-2);
        }
        Ok(LotkaVolterra {
            alpha: p[0],
            beta: p[1],
            delta: p[2],
            gamma: p[3],
            x: p[4],
            y: p[5],
        })
    }

    fn step(&mut self, _t: f64, h: f64, out: &mut [f64]) -> Result<Step, i32> {
        let fastest = [
            1.0,
            self.alpha,
            self.gamma,
            self.beta * self.x,
            self.delta * self.y,
        ]
        .into_iter()
        .fold(0.0, f64::max);
        let substeps = (h * fastest / 0.001).ceil().max(1.0);
        if substeps > MAX_SUBSTEPS {
            return Err(-4);
        }
        let dt = h / substeps;
        for _ in 0..substeps as u64 {
            self.rk4(dt);
        }
        if !(self.x.is_finite() && self.y.is_finite()) {
            return Err(-3);
        }
        out[0] = self.x;
        out[1] = self.y;
        Ok(Step::Continue)
    }
}

model_abi::export_model!(LotkaVolterra);

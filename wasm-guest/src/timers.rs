//! `setTimeout`, `setInterval`, `clearTimeout` and `clearInterval`.
//!
//! Timers run after the script and its promise jobs, one at a time in deadline order
//! (ties in creation order). Waiting is done in short sleeps so that the host's epoch
//! deadline, which is checked only while guest code runs, ends a snippet that waits on a
//! far-off timer within one of those sleeps of its deadline.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rquickjs::function::{Opt, Rest};
use rquickjs::{Coerced, Ctx, Exception, Function, Value};

/// The longest single sleep while waiting for a timer.
const SLEEP_SLICE: Duration = Duration::from_millis(5);

/// What one turn of the timer loop did.
pub enum Step<'js> {
    /// A timer's callback ran; `Err` carries what it threw.
    Ran(Result<(), Value<'js>>),
    /// No timer is left.
    Empty,
}

struct Timer<'js> {
    id: f64,
    due: Instant,
    every: Option<Duration>,
    callback: Function<'js>,
    args: Vec<Value<'js>>,
}

#[derive(Default)]
struct Timers<'js> {
    next_id: f64,
    pending: Vec<Timer<'js>>,
}

/// The snippet's timers.
#[derive(Default)]
pub struct TimerQueue<'js> {
    timers: Rc<RefCell<Timers<'js>>>,
}

impl<'js> TimerQueue<'js> {
    /// Defines the four timer functions on the global object.
    pub fn install(&self, ctx: &Ctx<'js>) -> rquickjs::Result<()> {
        for (name, repeat) in [("setTimeout", false), ("setInterval", true)] {
            let timers = self.timers.clone();
            let set = Function::new(
                ctx.clone(),
                move |ctx: Ctx<'js>,
                      callback: Value<'js>,
                      delay: Opt<Value<'js>>,
                      args: Rest<Value<'js>>| {
                    let Some(callback) = callback.into_function() else {
                        return Err(Exception::throw_type(
                            &ctx,
                            "the callback must be a function",
                        ));
                    };
                    let delay = delay_of(delay.0);
                    let mut timers = timers.borrow_mut();
                    timers.next_id += 1.0;
                    let id = timers.next_id;
                    timers.pending.push(Timer {
                        id,
                        due: Instant::now() + delay,
                        every: repeat.then_some(delay),
                        callback,
                        args: args.0,
                    });
                    Ok(id)
                },
            )?;
            ctx.globals().set(name, set)?;
        }
        for name in ["clearTimeout", "clearInterval"] {
            let timers = self.timers.clone();
            let clear = Function::new(ctx.clone(), move |id: Opt<Value<'js>>| {
                if let Some(id) = id.0.and_then(|v| v.as_number()) {
                    timers.borrow_mut().pending.retain(|t| t.id != id);
                }
            })?;
            ctx.globals().set(name, clear)?;
        }
        Ok(())
    }

    /// Waits for the earliest timer and runs its callback.
    pub fn run_next(&self, ctx: &Ctx<'js>) -> Step<'js> {
        let next = {
            let timers = self.timers.borrow();
            timers
                .pending
                .iter()
                .min_by(|a, b| a.due.cmp(&b.due).then(a.id.total_cmp(&b.id)))
                .map(|t| (t.id, t.due))
        };
        let Some((id, due)) = next else {
            return Step::Empty;
        };
        loop {
            let now = Instant::now();
            if now >= due {
                break;
            }
            std::thread::sleep((due - now).min(SLEEP_SLICE));
        }
        let (callback, args) = {
            let mut timers = self.timers.borrow_mut();
            let Some(index) = timers.pending.iter().position(|t| t.id == id) else {
                return Step::Ran(Ok(()));
            };
            let timer = &mut timers.pending[index];
            let fired = (timer.callback.clone(), timer.args.clone());
            match timer.every {
                // An interval of 0 still yields to the other timers.
                Some(every) => timer.due = Instant::now() + every.max(Duration::from_millis(1)),
                None => {
                    timers.pending.remove(index);
                }
            }
            fired
        };
        match callback.call::<_, ()>((Rest(args),)) {
            Ok(()) => Step::Ran(Ok(())),
            Err(rquickjs::Error::Exception) => Step::Ran(Err(ctx.catch())),
            Err(other) => Step::Ran(Err(rquickjs::String::from_str(
                ctx.clone(),
                &other.to_string(),
            )
            .map(rquickjs::String::into_value)
            .unwrap_or_else(|_| Value::new_undefined(ctx.clone())))),
        }
    }
}

/// A delay in ms as JavaScript would coerce it: missing, negative or NaN is 0.
fn delay_of(value: Option<Value<'_>>) -> Duration {
    let ms = value
        .and_then(|v| v.get::<Coerced<f64>>().ok())
        .map_or(0.0, |Coerced(ms)| ms);
    if ms.is_finite() && ms > 0.0 {
        Duration::from_secs_f64(ms.min(f64::from(u32::MAX)) / 1000.0)
    } else {
        Duration::ZERO
    }
}

//! Queue mode: hold requests until their reserved slot instead of rejecting them (a leaky bucket).

use std::time::Duration;

use crate::algorithm::{Algorithm, Mode, ReserveBound};

/// How a token-bucket or fixed-window rule queues requests that would be denied.
///
/// A queued request reserves its units at once (the balance goes negative), waits locally
/// until its slot, then reaches the service; requests of one key leave in reservation order, and a
/// large request is never starved by small ones, since it holds its place from the start. Past the
/// bound the request is denied as usual. A waiting request whose client goes away gives its units
/// back.
///
/// The parameters mirror nginx's `limit_req`:
///
/// | nginx | tollgate |
/// |---|---|
/// | `rate=1r/s` | `Limit::per_second(1)` (capacity 1, as in nginx) |
/// | `burst=5` | `Queue::burst(5)`: up to 5 excess requests are held |
/// | `burst=5 delay=2` | `Queue::burst(5).delay(2)`: the first 2 excess pass at once, 3 more wait |
/// | `burst=5 nodelay` | `Queue::burst(5).nodelay()`: all 5 excess pass at once, none waits |
///
/// With `rate=1r/s burst=5` and seven simultaneous requests, one passes, five wait 1, 2, 3, 4 and
/// 5 seconds, and one is rejected; with `delay=2`, three pass, three wait 1, 2 and 3 seconds, one is
/// rejected; with `nodelay`, six pass and one is rejected.
///
/// On a fixed window a queued request waits for the start of the first window that pays its
/// units back: with 10 per minute, 16 requests at a window's start let 10 pass and 6
/// wait for the next window; `delay` and `nodelay` do not apply (a window has no excess that
/// passes at once).
///
/// On a [concurrency limit](crate::Limit::concurrent), a request finding no free slot waits for
/// one, first come, first served: `burst` bounds how many requests of a key wait on this
/// instance, `max_delay` how long each waits; past either it is denied (`Retry-After: 1`). A
/// released slot wakes the next waiter at once; with a store shared by several instances
/// (Redis), slots released by another instance are found by polling, every 50 ms at first,
/// backing off to every 500 ms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Queue {
    burst: Option<u64>,
    delay: u64,
    max_delay: Option<Duration>,
}

impl Queue {
    /// Up to `units` units beyond the limit's capacity are admitted: the first
    /// [`delay`](Self::delay) of them at once, the rest spaced at the limit's rate.
    pub fn burst(units: u64) -> Queue {
        Queue {
            burst: Some(units),
            ..Queue::default()
        }
    }

    /// No request waits longer than `max` (may be combined with [`burst`](Self::burst)).
    pub fn max_delay(max: Duration) -> Queue {
        Queue {
            max_delay: Some(max),
            ..Queue::default()
        }
    }

    /// Also bound the wait by `max`.
    pub fn within(mut self, max: Duration) -> Queue {
        self.max_delay = Some(max);
        self
    }

    /// The first `units` excess units pass without waiting (nginx `delay=N`).
    pub fn delay(mut self, units: u64) -> Queue {
        self.delay = units;
        self
    }

    /// Every excess unit within the burst passes without waiting (nginx `nodelay`).
    pub fn nodelay(mut self) -> Queue {
        self.delay = self.burst.unwrap_or(0);
        self
    }

    /// Units that pass at once beyond the capacity.
    pub(crate) fn immediate(&self) -> u64 {
        self.delay
    }

    /// The reservation bound: how far the balance may go negative, and for how long.
    pub(crate) fn bound(&self) -> ReserveBound {
        ReserveBound {
            max_units: self.burst.map(|burst| burst.saturating_sub(self.delay)),
            max_wait: self.max_delay,
        }
    }

    /// Checks the settings against the rule's algorithm and fixed cost; `Err((field, message))`.
    pub(crate) fn validate(
        &self,
        algorithm: &Algorithm,
        cost: Option<u64>,
    ) -> Result<(), (&'static str, String)> {
        match algorithm {
            Algorithm::TokenBucket(_) => {}
            Algorithm::FixedWindow(_) if self.delay > 0 => {
                return Err((
                    "queue.delay",
                    "a fixed window lets no excess pass at once: raise its limit instead".into(),
                ));
            }
            Algorithm::FixedWindow(_) => {}
            Algorithm::Concurrency(_) if self.delay > 0 => {
                return Err((
                    "queue.delay",
                    "a concurrency rule lets no excess pass at once: raise `concurrent` instead"
                        .into(),
                ));
            }
            Algorithm::Concurrency(_) => {}
            _ => {
                return Err((
                    "queue",
                    "queue mode needs a token bucket (a queued token bucket is a leaky bucket), \
                     a fixed window or a concurrency limit"
                        .into(),
                ));
            }
        }
        if self.burst.is_none() && self.max_delay.is_none() {
            return Err((
                "queue",
                "needs a bound: a burst, a max_delay, or both".into(),
            ));
        }
        if let Some(burst) = self.burst {
            if self.delay > burst {
                return Err((
                    "queue.delay",
                    format!("must be at most the burst ({burst})"),
                ));
            }
            let waiting = burst - self.delay;
            if let Some(cost) = cost.filter(|&cost| waiting > 0 && cost > waiting) {
                return Err((
                    "queue.burst",
                    format!(
                        "lets {waiting} units wait, less than the cost ({cost}): a request arriving at an empty bucket could never queue"
                    ),
                ));
            }
        }
        if self.max_delay == Some(Duration::ZERO) {
            return Err(("queue.max_delay", "must be greater than 0".into()));
        }
        Ok(())
    }

    /// The algorithm a queued rule runs (its capacity grows by the immediate units) and its mode.
    pub(crate) fn apply(&self, algorithm: &Algorithm) -> (Algorithm, Mode) {
        let algorithm = match algorithm {
            Algorithm::TokenBucket(tb) if self.delay > 0 => {
                let capacity = tb.capacity().saturating_add(self.delay);
                let initial = tb.initial().saturating_add(self.delay);
                Algorithm::TokenBucket(tb.clone().with_capacity(capacity).with_initial(initial))
            }
            other => other.clone(),
        };
        (algorithm, Mode::Reserve(self.bound()))
    }
}

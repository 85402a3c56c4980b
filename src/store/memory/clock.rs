//! The memory store's clock: the system clock called directly, any other through its trait
//! object, never read earlier than a time read before.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::algorithm::Micros;
use crate::clock::{Clock, Latest, SystemClock};

/// The store's clock. The default system clock is called directly, so its read inlines into the
/// decision; any other clock goes through its trait object.
///
/// Either way the store never reads a time earlier than one it read before: the system clock
/// sees to that itself, and any other clock (a test's manual clock, your own) is held to the
/// latest time read. So no algorithm is handed a `now` before a key's stored time — a clock
/// that steps back reads as standing still — which the buckets, keeping only the moment they were
/// empty, could not tell from time not yet refilled.
#[derive(Clone)]
pub(super) enum StoreClock {
    System(SystemClock),
    Custom(Arc<dyn Clock>, Arc<Latest>),
}

impl StoreClock {
    pub(super) fn new(clock: impl Clock) -> Self {
        match (&clock as &dyn Any).downcast_ref::<SystemClock>() {
            Some(system) => StoreClock::System(system.clone()),
            None => StoreClock::Custom(Arc::new(clock), Arc::default()),
        }
    }

    #[inline]
    pub(super) fn now(&self) -> Micros {
        match self {
            StoreClock::System(clock) => clock.now(),
            StoreClock::Custom(clock, latest) => latest.at_least(clock.now()),
        }
    }
}

impl fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreClock::System(clock) => clock.fmt(f),
            StoreClock::Custom(clock, _) => clock.fmt(f),
        }
    }
}

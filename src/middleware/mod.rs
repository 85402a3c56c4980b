//! The Tower glue: the layer and its builder, the service, the decision once the store has
//! answered, the response future and body.
//!
//! A request goes `service` (route it, ask the store) → `decide` (forward, hold, wait in line,
//! or answer) → `future` (carries that out, settles and releases when the response is known) →
//! `body` (holds slots and settlements until the last frame). This stage reads every stage above
//! it and owns no rate-limiting logic of its own: no algorithm's details, no store's.
//!
//! [`RateLimitLayer`](crate::RateLimitLayer) and its builder are at the crate's root; this module
//! holds the service it builds, that service's future and body, the custom rejection hook's types,
//! and the top-offender lists the layer keeps.

pub(crate) mod body;
mod decide;
pub(crate) mod future;
pub(crate) mod layer;
pub(crate) mod service;
pub(crate) mod shared;

pub use crate::observe::offenders::{Offender, TopOffenders};
pub use crate::response::{Rejection, RespondFn};
pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use service::RateLimit;

//! The Tower glue: the layer and its builder, the service, the decision once the store has
//! answered, the response future and body.
//!
//! A request goes `service` (route it, ask the store) → `decide` (forward, hold, wait in line,
//! or answer) → `future` (carries that out, settles and releases when the response is known) →
//! `body` (holds slots and settlements until the last frame). This stage reads every stage above
//! it and owns no rate-limiting logic of its own: no algorithm's details, no store's.

pub(crate) mod body;
mod decide;
pub(crate) mod future;
pub(crate) mod layer;
pub(crate) mod service;
pub(crate) mod shared;

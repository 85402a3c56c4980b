//! Decisions taken at once: the memory store answers without waiting, so a replay polls each
//! decision once instead of running an async runtime.

use std::task::{Context, Poll, Waker};

/// The value of a future that is ready at once (the memory store's decisions).
#[inline(always)]
pub(crate) fn now<F: std::future::Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => Some(value),
        Poll::Pending => None,
    }
}

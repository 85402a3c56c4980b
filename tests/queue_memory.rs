//! 10,000 requests waiting in the queue stay within a stated memory bound.
//!
//! A counting allocator (this test binary's only test, so nothing else allocates meanwhile)
//! measures the heap held while the requests wait: the request, the future holding the ready
//! service and the timer, the spawned task, and the store's state.

// A global allocator is an `unsafe impl`; it only forwards to the system allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::{Limit, Queue, Rule};
use tower::{service_fn, Layer, ServiceExt};

use tollgate_test_support::paused;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The bound the guide's queueing chapter states for one waiting request (with an empty-bodied request and a
/// trivial inner service): 2 KiB.
const BYTES_PER_WAITING_REQUEST: isize = 2 * 1024;

#[tokio::test(start_paused = true)]
async fn ten_thousand_waiting_requests_stay_within_the_bound() {
    const WAITING: usize = 10_000;
    let layer =
        paused::layer(Rule::new("upstream", Limit::per_second(100)).queue(Queue::burst(20_000)));
    let service = layer.layer(service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    }));
    // Spend the burst so that every request below has to wait.
    for _ in 0..100 {
        service
            .clone()
            .oneshot(Request::new(Full::default()))
            .await
            .unwrap();
    }
    let before = LIVE.load(Ordering::Relaxed);
    let tasks: Vec<_> = (0..WAITING)
        .map(|_| tokio::spawn(service.clone().oneshot(Request::new(Full::default()))))
        .collect();
    // Let every task reach its queue slot (none is due before 10 ms).
    tokio::task::yield_now().await;
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    let held = LIVE.load(Ordering::Relaxed) - before;
    let per_request = held / WAITING as isize;
    println!("{per_request} bytes per waiting request ({held} bytes for {WAITING})");
    assert!(per_request > 0, "the requests are really waiting");
    assert!(
        per_request <= BYTES_PER_WAITING_REQUEST,
        "{per_request} bytes per waiting request exceeds the stated bound"
    );
    // All of them are served, in order, within 100 s of paused time.
    tokio::time::advance(Duration::from_secs(101)).await;
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

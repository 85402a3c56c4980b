//! Many tasks charging one rule at once, through one or several limiters (app instances).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tollgate::Limiter;

/// Spawns `tasks` tasks per limiter, each charging `rule` (key "", cost 1) `attempts` times, and
/// returns how many charges were admitted.
pub async fn hammer(
    limiters: &[Limiter],
    rule: &'static str,
    tasks: usize,
    attempts: usize,
) -> usize {
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for limiter in limiters {
        for _ in 0..tasks {
            let (limiter, admitted) = (limiter.clone(), admitted.clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..attempts {
                    if limiter.charge(rule, "", 1).await.unwrap().is_allowed() {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
    admitted.load(Ordering::SeqCst)
}

//! The keys each rule denies most: a Space-Saving sketch per rule, fed by the middleware's
//! denials only, read through [`RateLimitLayer::top_offenders`](crate::RateLimitLayer::top_offenders).
//!
//! Space-Saving (Metwally, Agrawal and El Abbadi, 2005) keeps `k` counters. A denied key that has
//! a counter adds one to it; a new key takes over the smallest counter, adds one to it, and
//! records the count it inherited as its `error`. The counts then always add up to `N`, the
//! denials seen, so the smallest is at most `N / k`: a key denied more often than that cannot
//! have been evicted, and every count is at most `error` above the key's true number.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::redact::Redactor;
use super::{LoggedKey, RuleMetrics};
use crate::key::KeyValue;

/// Counters per rule when nothing else is said: enough for a dashboard's top list.
pub(crate) const DEFAULT_CAPACITY: usize = 64;

/// A rule's list as its sketch holds it now, without the utilisation (read from the store by
/// the caller), and the key denied most.
pub(crate) fn list(
    metrics: &RuleMetrics,
    rule: &str,
    redact: Option<&Redactor>,
) -> (TopOffenders, Option<KeyValue>) {
    let (denials, counters) = metrics.offenders.snapshot();
    let offenders = counters
        .iter()
        .map(|c| Offender {
            key: LoggedKey::new(&c.key, redact).to_string(),
            denied: c.count,
            error: c.error,
        })
        .collect();
    let top = TopOffenders {
        rule: rule.to_owned(),
        denials,
        capacity: metrics.offenders.capacity(),
        offenders,
        utilisation: None,
    };
    (top, counters.into_iter().next().map(|c| c.key))
}

/// One rule's sketch.
///
/// Taken only on denial, under a mutex of its own (one per rule): allowed requests never touch
/// it. A denial holds the lock for one hash lookup and a walk of at most `log2 k` heap levels,
/// with no allocation once the sketch is full (but to copy a key longer than 48 bytes), so in a
/// flood where every request is denied the lock is held for a few steps per request. (Sketches
/// per thread, merged on read, would spread the lock at the price of looser bounds.)
#[derive(Debug)]
pub(crate) struct TopKeys {
    capacity: usize,
    sketch: Mutex<SpaceSaving>,
}

impl TopKeys {
    pub(crate) fn new(capacity: usize) -> Self {
        TopKeys {
            capacity,
            sketch: Mutex::new(SpaceSaving::default()),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counts one denial of `key`.
    pub(crate) fn record(&self, key: &KeyValue) {
        if self.capacity == 0 {
            return;
        }
        // Nothing in `add` can panic with the lock held; a poisoned lock still holds counts.
        let mut sketch = self.sketch.lock().unwrap_or_else(PoisonError::into_inner);
        sketch.add(key, self.capacity);
    }

    /// The denials seen and every counter, the highest count first (ties by key).
    pub(crate) fn snapshot(&self) -> (u64, Vec<Counter>) {
        let (total, mut counters) = {
            let sketch = self.sketch.lock().unwrap_or_else(PoisonError::into_inner);
            (sketch.total, sketch.heap.clone())
        };
        counters.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.key.as_bytes().cmp(b.key.as_bytes()))
        });
        (total, counters)
    }
}

/// A key and what its counter says.
#[derive(Clone, Debug)]
pub(crate) struct Counter {
    pub(crate) key: KeyValue,
    /// Denials counted for the key: never fewer than its true number.
    pub(crate) count: u64,
    /// How much of `count` the key may have inherited from the key it evicted.
    pub(crate) error: u64,
}

/// The counters as a binary min-heap on `count`, and where each key sits in it: an increment
/// moves a counter down, an eviction replaces the root.
#[derive(Debug, Default)]
struct SpaceSaving {
    total: u64,
    heap: Vec<Counter>,
    /// Seeded per sketch, so nobody can aim collisions at it.
    place: HashMap<KeyValue, usize, foldhash::fast::RandomState>,
}

impl SpaceSaving {
    fn add(&mut self, key: &KeyValue, capacity: usize) {
        self.total += 1;
        if let Some(&at) = self.place.get(key) {
            self.heap[at].count += 1;
            self.sift_down(at);
        } else if self.heap.len() < capacity {
            let at = self.heap.len();
            self.heap.push(Counter {
                key: key.clone(),
                count: 1,
                error: 0,
            });
            self.place.insert(key.clone(), at);
            self.sift_up(at);
        } else {
            let min = self.heap[0].count;
            let evicted = std::mem::replace(
                &mut self.heap[0],
                Counter {
                    key: key.clone(),
                    count: min + 1,
                    error: min,
                },
            );
            self.place.remove(&evicted.key);
            self.place.insert(key.clone(), 0);
            self.sift_down(0);
        }
    }

    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.heap[parent].count <= self.heap[at].count {
                break;
            }
            self.swap(at, parent);
            at = parent;
        }
    }

    fn sift_down(&mut self, mut at: usize) {
        loop {
            let (left, right) = (2 * at + 1, 2 * at + 2);
            let mut least = at;
            if left < self.heap.len() && self.heap[left].count < self.heap[least].count {
                least = left;
            }
            if right < self.heap.len() && self.heap[right].count < self.heap[least].count {
                least = right;
            }
            if least == at {
                return;
            }
            self.swap(at, least);
            at = least;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        for at in [a, b] {
            if let Some(place) = self.place.get_mut(&self.heap[at].key) {
                *place = at;
            }
        }
    }
}

/// The keys a rule denied most, from [`RateLimitLayer::top_offenders`](crate::RateLimitLayer::top_offenders).
///
/// Counts come from a Space-Saving sketch of fixed size ([`capacity`](Self::capacity) keys per
/// rule): it cannot miss a key denied more than [`guaranteed_above`](Self::guaranteed_above)
/// times, and each key's [`denied`](Offender::denied) is exact to within its
/// [`error`](Offender::error).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TopOffenders {
    /// The rule.
    pub rule: String,
    /// Requests the rule denied (for a shadow rule, or under the layer's `shadow` switch: would
    /// have denied) since the limiter was built; a reload keeps the counts of rules that keep
    /// their name.
    pub denials: u64,
    /// The most keys the sketch holds.
    pub capacity: usize,
    /// The keys held, the most denied first (ties in key order).
    pub offenders: Vec<Offender>,
    /// How much of its limit the most denied key has used now, from 0 to 1 (`1 − remaining /
    /// limit`, read from the store at no cost when the list is read); `None` with no offender,
    /// or when the store could not answer. A rule whose limit is chosen per request is read
    /// against its default limit.
    pub utilisation: Option<f64>,
}

impl TopOffenders {
    /// Every key denied more than this many times is in [`offenders`](Self::offenders):
    /// `denials / capacity`.
    pub fn guaranteed_above(&self) -> u64 {
        match self.capacity {
            0 => self.denials,
            k => self.denials / k as u64,
        }
    }
}

/// One key of [`TopOffenders`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Offender {
    /// The key, or when keys are redacted the short hash the logs show for it (`#` and 16 hex
    /// digits).
    pub key: String,
    /// Denials counted for the key: at least its true number, at most `error` more.
    pub denied: u64,
    /// The most `denied` may overcount: the key was denied at least `denied − error` times.
    pub error: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> KeyValue {
        KeyValue::new(name.as_bytes())
    }

    fn counts(top: &TopKeys) -> Vec<(String, u64, u64)> {
        top.snapshot()
            .1
            .into_iter()
            .map(|c| (c.key.to_string(), c.count, c.error))
            .collect()
    }

    fn sketch_is_consistent(top: &TopKeys) {
        let sketch = top.sketch.lock().unwrap();
        assert_eq!(sketch.place.len(), sketch.heap.len());
        for (at, counter) in sketch.heap.iter().enumerate() {
            assert_eq!(sketch.place[&counter.key], at);
            if at > 0 {
                assert!(sketch.heap[(at - 1) / 2].count <= counter.count);
            }
        }
        let sum: u64 = sketch.heap.iter().map(|c| c.count).sum();
        assert_eq!(sum, sketch.total, "the counts add up to the denials seen");
    }

    #[test]
    fn counts_and_errors_are_exact_on_a_crafted_stream() {
        let top = TopKeys::new(3);
        // a a a b b c: three counters, no eviction, every count exact.
        for name in ["a", "a", "a", "b", "b", "c"] {
            top.record(&key(name));
        }
        assert_eq!(
            counts(&top),
            [("a".into(), 3, 0), ("b".into(), 2, 0), ("c".into(), 1, 0)]
        );
        // d takes c's counter (the least, 1): d = 2, error 1.
        top.record(&key("d"));
        assert_eq!(
            counts(&top),
            [("a".into(), 3, 0), ("b".into(), 2, 0), ("d".into(), 2, 1)]
        );
        // b and d tie as the least; d is the one at the heap's root, so e takes its counter:
        // e = 3, error 2, and d is gone.
        top.record(&key("e"));
        assert_eq!(
            counts(&top),
            [("a".into(), 3, 0), ("e".into(), 3, 2), ("b".into(), 2, 0)]
        );
        sketch_is_consistent(&top);
        assert_eq!(top.snapshot().0, 8);
    }

    #[test]
    fn a_key_denied_more_than_n_over_k_times_is_always_listed() {
        let capacity = 10;
        let top = TopKeys::new(capacity);
        // 1,000 one-off keys interleaved with a heavy key: 1,000 + 120 = 1,120 denials, and
        // 120 > 1,120 / 10 = 112, so the heavy key must be listed, its count within its error.
        let heavy = key("heavy");
        let mut true_count = 0;
        for i in 0..1_000 {
            top.record(&key(&format!("one-off-{i}")));
            if i % 25 < 3 {
                top.record(&heavy);
                true_count += 1;
            }
        }
        assert_eq!(true_count, 120);
        let (total, counters) = top.snapshot();
        assert_eq!(total, 1_120);
        let listed = counters.iter().find(|c| c.key == heavy).expect("listed");
        assert!(listed.count >= true_count && listed.count - listed.error <= true_count);
        assert_eq!(counters[0].key, heavy, "{counters:?}");
        for counter in &counters {
            assert!(counter.error <= total / capacity as u64);
        }
        sketch_is_consistent(&top);
    }

    proptest::proptest! {
        /// On any stream: every key denied more than N / k times is listed, and every listed
        /// count is within its error of the key's true number.
        #[test]
        fn the_guarantees_hold_on_any_stream(
            capacity in 1usize..8,
            stream in proptest::collection::vec(0u8..20, 0..300),
        ) {
            let top = TopKeys::new(capacity);
            let mut truth = HashMap::<u8, u64>::new();
            for &k in &stream {
                top.record(&key(&k.to_string()));
                *truth.entry(k).or_default() += 1;
            }
            let (total, counters) = top.snapshot();
            proptest::prop_assert_eq!(total, stream.len() as u64);
            proptest::prop_assert!(counters.len() <= capacity);
            for (k, &n) in &truth {
                let listed = counters.iter().find(|c| c.key == key(&k.to_string()));
                if n > total / capacity as u64 {
                    proptest::prop_assert!(listed.is_some(), "key {} denied {} times", k, n);
                }
                if let Some(c) = listed {
                    proptest::prop_assert!(c.count >= n && c.count - c.error <= n);
                }
            }
            sketch_is_consistent(&top);
        }
    }

    #[test]
    fn memory_is_fixed_under_100_000_distinct_keys() {
        let top = TopKeys::new(DEFAULT_CAPACITY);
        for i in 0..100_000u32 {
            top.record(&key(&i.to_string()));
            if i % 9_999 == 0 {
                let sketch = top.sketch.lock().unwrap();
                assert!(sketch.heap.len() <= DEFAULT_CAPACITY);
                assert!(sketch.place.len() <= DEFAULT_CAPACITY);
            }
        }
        let sketch = top.sketch.lock().unwrap();
        assert_eq!(sketch.heap.len(), DEFAULT_CAPACITY);
        assert_eq!(sketch.place.len(), DEFAULT_CAPACITY);
        // The map never grew past what 64 entries need (it may keep room, never more).
        assert!(sketch.place.capacity() < 4 * DEFAULT_CAPACITY);
        assert!(sketch.heap.capacity() <= 2 * DEFAULT_CAPACITY);
        drop(sketch);
        sketch_is_consistent(&top);
    }

    #[test]
    fn a_capacity_of_zero_keeps_nothing() {
        let top = TopKeys::new(0);
        top.record(&key("a"));
        let (total, counters) = top.snapshot();
        assert_eq!(total, 0);
        assert!(counters.is_empty());
    }
}

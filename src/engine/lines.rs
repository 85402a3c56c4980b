//! The first-come-first-served lines of requests waiting for a concurrency slot on this
//! instance (queue mode): one line per (rule, key), woken when a slot is given back.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::key::KeyValue;

/// A line's name: the rule's and the key.
pub(crate) type LineOf = (Arc<str>, KeyValue);

/// The lines of requests waiting for a slot, per (rule, key), on this instance: by rule, then by
/// key, so that looking a line up borrows the rule's name and the key instead of building a pair.
#[derive(Default)]
pub(crate) struct Lines {
    lines: Mutex<HashMap<Arc<str>, HashMap<KeyValue, Line>>>,
}

type Line = VecDeque<Arc<Waiter>>;

/// One waiting request: woken when a slot may be free for it.
#[derive(Default)]
pub(crate) struct Waiter {
    woken: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Waiter {
    pub(crate) fn wake(&self) {
        self.woken.store(true, Ordering::Release);
        if let Some(waker) = lock(&self.waker).take() {
            waker.wake();
        }
    }

    pub(crate) fn poll_woken(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.woken.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        *lock(&self.waker) = Some(cx.waker().clone());
        // A wake between the first look and storing the waker would be lost without this one.
        if self.woken.swap(false, Ordering::AcqRel) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// A poisoned lock only means another thread panicked while holding it; the data (a line of
/// waiters, a waker) is still consistent, so carry on rather than spread the panic.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Lines {
    /// Wakes the first waiter for `(rule, key)`, if any: a slot was given back.
    pub(crate) fn wake(&self, rule: &str, key: &KeyValue) {
        let lines = lock(&self.lines);
        if let Some(first) = line(&lines, rule, key).and_then(|l| l.front()) {
            first.wake();
        }
    }

    /// Whether requests already wait for `(rule, key)`: a newcomer then queues behind them
    /// instead of taking a slot first.
    pub(crate) fn busy(&self, rule: &str, key: &KeyValue) -> bool {
        let lines = lock(&self.lines);
        line(&lines, rule, key).is_some_and(|line| !line.is_empty())
    }

    /// Puts `waiter` at the end of the line, unless `max` already wait; whether it went in, and
    /// whether it is first.
    pub(crate) fn join(
        &self,
        (rule, key): &LineOf,
        waiter: &Arc<Waiter>,
        max: Option<u64>,
    ) -> Option<bool> {
        let mut lines = lock(&self.lines);
        let of_rule = lines.entry(rule.clone()).or_default();
        let queue = of_rule.entry(key.clone()).or_default();
        if max.is_some_and(|max| queue.len() as u64 >= max) {
            if queue.is_empty() {
                remove(&mut lines, rule, key);
            }
            return None;
        }
        queue.push_back(waiter.clone());
        Some(queue.len() == 1)
    }

    pub(crate) fn is_first(&self, (rule, key): &LineOf, waiter: &Arc<Waiter>) -> bool {
        let lines = lock(&self.lines);
        line(&lines, rule, key)
            .and_then(|queue| queue.front())
            .is_some_and(|first| Arc::ptr_eq(first, waiter))
    }

    /// Takes `waiter` out of the line; if it was first, the next one is woken (a slot may be
    /// free, and the one leaving will not take it).
    pub(crate) fn leave(&self, (rule, key): &LineOf, waiter: &Arc<Waiter>) {
        let mut lines = lock(&self.lines);
        let Some(queue) = lines.get_mut(&**rule).and_then(|l| l.get_mut(key)) else {
            return;
        };
        let first = queue.front().is_some_and(|w| Arc::ptr_eq(w, waiter));
        queue.retain(|w| !Arc::ptr_eq(w, waiter));
        match queue.front() {
            None => remove(&mut lines, rule, key),
            Some(next) if first => next.wake(),
            Some(_) => {}
        }
    }
}

fn line<'a>(
    lines: &'a HashMap<Arc<str>, HashMap<KeyValue, Line>>,
    rule: &str,
    key: &KeyValue,
) -> Option<&'a Line> {
    lines.get(rule)?.get(key)
}

/// Forgets an empty line, and its rule's map once no line of the rule is left.
fn remove(lines: &mut HashMap<Arc<str>, HashMap<KeyValue, Line>>, rule: &str, key: &KeyValue) {
    if let Some(of_rule) = lines.get_mut(rule) {
        of_rule.remove(key);
        if of_rule.is_empty() {
            lines.remove(rule);
        }
    }
}

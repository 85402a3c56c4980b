//! Per-key overrides in the memory store: a table by rule and key, read by the charges of
//! overridable rules only, and listed a page at a time.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use smallvec::SmallVec;

use super::MemoryStore;
use crate::algorithm::{duration, micros, Limit, Micros};
use crate::key::KeyValue;
use crate::store::{
    Charge, Cursor, Outcomes, OverrideEntry, Page, StoreError, StoreErrorKind, MAX_OVERRIDE_PAGE,
};

/// Overrides by rule name, then key: the limit (shared, so that an outcome decided under it
/// carries it without allocating) and when it ends.
pub(super) type Overrides = BTreeMap<String, BTreeMap<Vec<u8>, (Arc<Limit>, Micros)>>;

impl MemoryStore {
    /// The overrides, held. A lock poisoned by a panic elsewhere is taken all the same, as this
    /// store's other locks are: the maps stay valid whatever a panic interrupted.
    fn override_table(&self) -> std::sync::MutexGuard<'_, Overrides> {
        self.inner
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets or removes the override of `key` under `rule` (see
    /// [`Store::set_override`](crate::store::Store::set_override)).
    pub(super) fn set_override_now(
        &self,
        rule: &str,
        key: &[u8],
        limit: Option<(&Limit, std::time::Duration)>,
    ) {
        let now = self.now();
        let mut table = self.override_table();
        // Expired overrides go whenever one is set: the table never holds more than were set
        // within the longest TTL.
        for keys in table.values_mut() {
            keys.retain(|_, (_, until)| *until > now);
        }
        table.retain(|_, keys| !keys.is_empty());
        match limit {
            Some((limit, ttl)) => {
                let until = now.saturating_add(micros(ttl));
                table
                    .entry(rule.to_owned())
                    .or_default()
                    .insert(key.to_vec(), (Arc::new(limit.clone()), until));
            }
            None => {
                if let Some(keys) = table.get_mut(rule) {
                    keys.remove(key);
                }
            }
        }
        let count = table.values().map(BTreeMap::len).sum();
        self.inner.overridden.store(count, Ordering::Release);
    }

    /// One page of `rule`'s overrides in force (see
    /// [`Store::overrides`](crate::store::Store::overrides)).
    pub(super) fn list_overrides(
        &self,
        rule: &str,
        cursor: Option<&Cursor>,
        count: usize,
    ) -> Result<Page<OverrideEntry>, StoreError> {
        let now = self.now();
        let table = self.override_table();
        let mut page = Page::new(Vec::new(), None);
        let Some(keys) = table.get(rule) else {
            return Ok(page);
        };
        // The cursor is the last key of the previous page, `o` and its bytes in hex.
        let after = match cursor.map(|cursor| cursor.key_after('o')) {
            Some(Some(key)) => Some(key),
            Some(None) => {
                return Err(StoreError::new(
                    StoreErrorKind::BadCursor,
                    "not a cursor of this memory store's override listings",
                ))
            }
            None => None,
        };
        let from = match &after {
            Some(key) => Bound::Excluded(key.as_slice()),
            None => Bound::Unbounded,
        };
        let count = count.clamp(1, MAX_OVERRIDE_PAGE);
        let mut live = keys
            .range::<[u8], _>((from, Bound::Unbounded))
            .filter(|(_, (_, until))| *until > now);
        for (key, (limit, until)) in live.by_ref().take(count) {
            page.items.push(OverrideEntry {
                key: KeyValue::new(key),
                limit: Limit::clone(limit),
                expires_in: duration(until - now),
            });
        }
        if live.next().is_some() {
            page.next = page
                .items
                .last()
                .map(|last| Cursor::after_key('o', last.key.as_bytes()));
        }
        Ok(page)
    }

    /// The override of `key` under `rule` in force now, if any.
    pub(super) fn override_now(&self, rule: &str, key: &[u8]) -> Option<OverrideEntry> {
        let now = self.now();
        let table = self.override_table();
        table
            .get(rule)
            .and_then(|keys| keys.get(key))
            .filter(|(_, until)| *until > now)
            .map(|(limit, until)| OverrideEntry {
                key: KeyValue::new(key),
                limit: Limit::clone(limit),
                expires_in: duration(until - now),
            })
    }

    /// A batch with charges of overridable rules: each such key's override in force replaces
    /// its charge's limit (unless the cost could never pass under it: then the rule's own
    /// decides, as for a per-request limit), and comes back with the charge's outcome.
    pub(super) fn overridden(&self, batch: &[Charge<'_>]) -> Outcomes {
        let found: SmallVec<[Option<Arc<Limit>>; 2]> =
            if self.inner.overridden.load(Ordering::Acquire) == 0 {
                batch.iter().map(|_| None).collect()
            } else {
                let now = self.now();
                let table = self.override_table();
                batch
                    .iter()
                    .map(|c| {
                        if !c.read_overrides {
                            return None;
                        }
                        let (limit, until) = table.get(c.rule.as_str())?.get(c.key)?;
                        let fits = c.cost <= limit.algorithm().max_cost(c.mode);
                        (*until > now && fits).then(|| limit.clone())
                    })
                    .collect()
            };
        let charges: SmallVec<[Charge<'_>; 2]> = batch
            .iter()
            .zip(&found)
            .map(|(c, limit)| Charge {
                algorithm: limit.as_deref().map_or(c.algorithm, Limit::algorithm),
                read_overrides: false,
                ..*c
            })
            .collect();
        let mut outcomes = self.apply_now(&charges);
        drop(charges);
        for (outcome, limit) in outcomes.iter_mut().zip(found) {
            outcome.overridden = limit;
        }
        outcomes
    }
}

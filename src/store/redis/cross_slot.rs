//! A batch over several Redis Cluster slots: one script call per slot, in slot order, each atomic
//! on its own; a denial takes the earlier groups' charges back and checks the later ones.

use std::collections::BTreeMap;

use super::record::{Item, Missing, Op, Record, Taken};
use super::reply::Applied;
use super::Inner;
use crate::algorithm::{Micros, Outcome, Verdict};
use crate::store::{Outcomes, StoreError};

impl Inner {
    /// The records grouped by cluster slot, in slot order.
    pub(super) fn groups(&self, records: &[Record]) -> Vec<Vec<usize>> {
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, record) in records.iter().enumerate() {
            groups.entry(record.candidates[0].slot).or_default().push(i);
        }
        groups.into_values().collect()
    }

    /// A batch over several slots: groups in slot order; a denial undoes the earlier groups.
    pub(super) async fn cross_slot(
        &self,
        now: Option<Micros>,
        records: &[Record],
        groups: &[Vec<usize>],
    ) -> Result<(Outcomes, Missing, Applied), StoreError> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; records.len()];
        let mut missing: Missing = smallvec::smallvec![false; records.len()];
        let mut taken = vec![Taken::default(); records.len()];
        let mut applied: Applied = smallvec::smallvec![None; records.len()];
        for (g, group) in groups.iter().enumerate() {
            let items: Vec<Item<'_>> = group.iter().map(|&i| Item::apply(&records[i])).collect();
            let (results, found) = self.call(Op::Apply, now, &items).await?;
            let denied = results.iter().any(|(o, _)| !o.verdict.is_admitted());
            for ((&i, (outcome, took)), limit) in group.iter().zip(results).zip(found) {
                outcomes[i] = Some(outcome);
                missing[i] = took.missing;
                taken[i] = took;
                applied[i] = limit;
            }
            if !denied {
                continue;
            }
            for earlier in &groups[..g] {
                // Each group committed atomically on its own: take this request's charges back
                // (the script leaves checks alone and reports what every key has left), under
                // the override a charge was made under.
                let under: Vec<Option<Record>> = earlier
                    .iter()
                    .map(|&i| Some(records[i].under(applied[i].as_ref()?)))
                    .collect();
                let items: Vec<Item<'_>> = earlier
                    .iter()
                    .zip(&under)
                    .map(|(&i, under)| Item {
                        only: Some(taken[i].chosen),
                        undo: taken[i],
                        ..Item::apply(under.as_ref().unwrap_or(&records[i]))
                    })
                    .collect();
                match self.call(Op::Undo, now, &items).await {
                    Ok((results, _)) => {
                        for (&i, (outcome, took)) in earlier.iter().zip(results) {
                            outcomes[i] = Some(outcome);
                            missing[i] = took.missing;
                        }
                    }
                    // The units stay taken until they refill: under-admits, never over.
                    Err(error) => {
                        tracing::warn!(%error, "rate-limit undo after a cross-slot denial failed")
                    }
                }
            }
            for later in &groups[g + 1..] {
                let items: Vec<Item<'_>> =
                    later.iter().map(|&i| Item::apply(&records[i])).collect();
                match self.call(Op::Check, now, &items).await {
                    Ok((results, found)) => {
                        for ((&i, (outcome, took)), limit) in later.iter().zip(results).zip(found) {
                            outcomes[i] = Some(outcome);
                            missing[i] = took.missing;
                            applied[i] = limit;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "rate-limit check after a cross-slot denial failed")
                    }
                }
            }
            break;
        }
        let outcomes = outcomes
            .into_iter()
            .zip(records)
            .map(|(outcome, record)| {
                // Only when a follow-up call failed: the request is denied anyway.
                outcome.unwrap_or_else(|| Outcome::new(Verdict::Allowed, record.limit, 0))
            })
            .collect();
        Ok((outcomes, missing, applied))
    }
}

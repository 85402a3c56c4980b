//! A batch decided over the rows read: the memory store's rules of a batch (blocks first, all or
//! nothing, the admitted rules' units reported uncharged when another denies, an offence's block
//! written in place of a charge), with the algorithms' own functions doing every count. The
//! rows changed come back as conditional writes.

use std::sync::Arc;

use crate::algorithm::{Algorithm, Block, Limit, Micros, Mode, Outcome, Penalty, Verdict};
use crate::key::KeyValue;
use crate::store::{Outcomes, StoreError, StoreErrorKind};

use super::rows::{self, State};
use super::{Row, RowKey, RowKind, Write};

/// A charge with everything it borrows copied, so that a decision can outlive the request's
/// borrow (the store answers from a future of its own).
#[derive(Clone, Debug)]
pub(super) struct Owned {
    pub(super) rule: String,
    /// The key's bytes as the request gave them (window offsets hash these).
    pub(super) key: Vec<u8>,
    pub(super) algorithm: Algorithm,
    pub(super) cost: u64,
    pub(super) mode: Mode,
    pub(super) penalty: Option<Penalty>,
    pub(super) overridable: bool,
}

/// Where each charge's rows are in the list read: its counter, its block, its override.
pub(super) struct Plan {
    pub(super) keys: Vec<RowKey>,
    counter: Vec<usize>,
    block: Vec<Option<usize>>,
    limit: Vec<Option<usize>>,
}

impl Plan {
    pub(super) fn new(charges: &[Owned]) -> Plan {
        let mut plan = Plan {
            keys: Vec::with_capacity(charges.len()),
            counter: Vec::with_capacity(charges.len()),
            block: Vec::with_capacity(charges.len()),
            limit: Vec::with_capacity(charges.len()),
        };
        for charge in charges {
            let counter = plan.place(RowKind::Counter, charge);
            plan.counter.push(counter);
            let block = charge
                .penalty
                .is_some()
                .then(|| plan.place(RowKind::Block, charge));
            plan.block.push(block);
            let limit = charge
                .overridable
                .then(|| plan.place(RowKind::Override, charge));
            plan.limit.push(limit);
        }
        plan
    }

    /// The index of the row of `kind` for `charge`, added if new (batches are a few rules: a
    /// linear search beats a map).
    fn place(&mut self, kind: RowKind, charge: &Owned) -> usize {
        let key = RowKey::new(kind, &charge.rule, &charge.key);
        match self.keys.iter().position(|k| *k == key) {
            Some(at) => at,
            None => {
                self.keys.push(key);
                self.keys.len() - 1
            }
        }
    }
}

/// What a batch comes to: its outcomes (each with the override it was decided under, if one
/// applied), and the rows to write.
pub(super) struct Decided {
    pub(super) outcomes: Outcomes,
    pub(super) writes: Vec<Write>,
}

/// Decides `charges` at `now` over `read`, the rows of `plan.keys` in order.
pub(super) fn batch(
    charges: &[Owned],
    plan: &Plan,
    read: &[Option<Row>],
    now: Micros,
) -> Result<Decided, StoreError> {
    // The override in force replaces a charge's limit, unless the cost could never pass under
    // it (then the rule's own decides, as for a per-request limit).
    let mut applied: Vec<Option<Limit>> = Vec::with_capacity(charges.len());
    for (charge, at) in charges.iter().zip(&plan.limit) {
        let found = match at.and_then(|at| read[at].as_ref()) {
            Some(row) => {
                let (until, limit) = rows::decode_override(&row.state)?;
                let fits = charge.cost <= limit.algorithm().max_cost(charge.mode);
                (until > now && fits).then_some(limit)
            }
            None => None,
        };
        applied.push(found);
    }
    let algorithms: Vec<&Algorithm> = charges
        .iter()
        .zip(&applied)
        .map(|(c, limit)| limit.as_ref().map_or(&c.algorithm, Limit::algorithm))
        .collect();
    let mut states: Vec<Option<State>> = vec![None; read.len()];
    let mut dirty = vec![false; read.len()];
    for (i, charge) in charges.iter().enumerate() {
        let at = plan.counter[i];
        if states[at].is_none() {
            states[at] = Some(current(charge, algorithms[i], read[at].as_ref(), now)?);
        }
    }
    let blocks: Vec<Option<Block>> = plan
        .block
        .iter()
        .map(|at| match at.and_then(|at| read[at].as_ref()) {
            Some(row) => rows::decode_block(&row.state).map(Some),
            None => Ok(None),
        })
        .collect::<Result<_, _>>()?;
    let state = |states: &[Option<State>], i: usize, charge: &Owned| -> Result<State, StoreError> {
        match &states[plan.counter[i]] {
            Some(state) if state.fits(algorithms[i]) => Ok(state.clone()),
            _ => fresh(charge, algorithms[i], now),
        }
    };
    let mut outcomes = Outcomes::new();
    for (i, charge) in charges.iter().enumerate() {
        let outcome = match blocks[i] {
            Some(block) if block.until > now => {
                Penalty::blocked(block.until, now, algorithms[i].capacity())
            }
            _ => evaluate(
                algorithms[i],
                &state(&states, i, charge)?,
                now,
                charge.cost,
                charge.mode,
            ),
        };
        outcomes.push(outcome);
    }
    let mut writes = Vec::new();
    if outcomes.iter().all(|o| o.verdict.is_admitted()) {
        for (i, charge) in charges.iter().enumerate() {
            if charge.mode == Mode::Check {
                continue;
            }
            let mut next = state(&states, i, charge)?;
            commit(algorithms[i], &mut next, now, charge.cost);
            states[plan.counter[i]] = Some(next);
            dirty[plan.counter[i]] = true;
        }
        for (at, state) in states.iter().enumerate() {
            if let (true, Some(state)) = (dirty[at], state) {
                let algorithm = charges
                    .iter()
                    .zip(&algorithms)
                    .zip(&plan.counter)
                    .find_map(|((_, a), &c)| (c == at).then_some(*a))
                    .unwrap_or(&charges[0].algorithm);
                writes.push(Write::put(
                    plan.keys[at].clone(),
                    read[at].as_ref(),
                    state.encode(),
                    expires_at(algorithm, state),
                ));
            }
        }
    } else {
        // All or nothing: report what the admitted rules have left, uncharged; a denial under a
        // penalty is an offence, unless the key is blocked already.
        for (i, charge) in charges.iter().enumerate() {
            let outcome = &mut outcomes[i];
            if outcome.verdict.is_admitted() {
                let peek = evaluate(
                    algorithms[i],
                    &state(&states, i, charge)?,
                    now,
                    0,
                    charge.mode,
                );
                *outcome = Outcome {
                    verdict: Verdict::Allowed,
                    ..peek
                };
            } else if let (Some(penalty), Some(at)) = (&charge.penalty, plan.block[i]) {
                let offends = charge.mode != Mode::Check && charge.cost > 0;
                if offends && blocks[i].is_none_or(|b| b.until <= now) {
                    let block = penalty.offend(blocks[i], now);
                    writes.push(Write::put(
                        plan.keys[at].clone(),
                        read[at].as_ref(),
                        rows::encode_block(&block),
                        penalty.forgotten_at(&block),
                    ));
                    *outcome = Penalty::punish(outcome.clone(), block.until, now);
                }
            }
        }
    }
    for (outcome, limit) in outcomes.iter_mut().zip(applied) {
        outcome.overridden = limit.map(Arc::new);
    }
    Ok(Decided { outcomes, writes })
}

/// The state a charge reads: the row's, or a fresh key's when there is none or it holds another
/// algorithm's state.
fn current(
    charge: &Owned,
    algorithm: &Algorithm,
    row: Option<&Row>,
    now: Micros,
) -> Result<State, StoreError> {
    match row {
        Some(row) => {
            let state = State::decode(&row.state)?;
            if state.fits(algorithm) {
                Ok(state)
            } else {
                fresh(charge, algorithm, now)
            }
        }
        None => fresh(charge, algorithm, now),
    }
}

/// The state of a key never seen before.
pub(super) fn fresh(
    charge: &Owned,
    algorithm: &Algorithm,
    now: Micros,
) -> Result<State, StoreError> {
    let offset = |period, start: crate::algorithm::WindowStart| {
        start.offset(period, &charge.rule, &charge.key)
    };
    Ok(match algorithm {
        Algorithm::TokenBucket(tb) => State::Bucket(tb.fresh(now)),
        Algorithm::FixedWindow(a) => {
            State::Window(a.fresh(now, offset(a.period_micros(), a.start())))
        }
        Algorithm::SlidingWindow(a) => {
            State::Sliding(a.fresh(now, offset(a.period_micros(), a.start())))
        }
        Algorithm::BurstPool(a) => State::Pool(a.fresh(now)),
        Algorithm::SlidingLog(_) => State::Log(Default::default()),
        Algorithm::Concurrency(_) => return Err(no_concurrency()),
    })
}

pub(super) fn no_concurrency() -> StoreError {
    StoreError::new(
        StoreErrorKind::Config,
        "concurrency limits are kept by the memory and Redis stores only",
    )
}

/// The outcome of charging `cost` at `now` to a key in `state` (which fits `algorithm`).
fn evaluate(algorithm: &Algorithm, state: &State, now: Micros, cost: u64, mode: Mode) -> Outcome {
    match (algorithm, state) {
        (Algorithm::TokenBucket(a), State::Bucket(s)) => a.evaluate(*s, now, cost, mode),
        (Algorithm::FixedWindow(a), State::Window(s)) => a.evaluate(*s, now, cost, mode),
        (Algorithm::SlidingWindow(a), State::Sliding(s)) => a.evaluate(*s, now, cost),
        (Algorithm::BurstPool(a), State::Pool(s)) => a.evaluate(*s, now, cost),
        (Algorithm::SlidingLog(a), State::Log(s)) => a.evaluate(s, now, cost),
        // `fresh` makes a state that fits.
        _ => Outcome::unreachable(algorithm),
    }
}

/// Charges `cost` (the batch was admitted).
fn commit(algorithm: &Algorithm, state: &mut State, now: Micros, cost: u64) {
    match (algorithm, state) {
        (Algorithm::TokenBucket(a), State::Bucket(s)) => *s = a.commit(*s, now, cost),
        (Algorithm::FixedWindow(a), State::Window(s)) => *s = a.commit(*s, now, cost),
        (Algorithm::SlidingWindow(a), State::Sliding(s)) => *s = a.commit(*s, now, cost),
        (Algorithm::BurstPool(a), State::Pool(s)) => *s = a.commit(*s, now, cost),
        (Algorithm::SlidingLog(a), State::Log(s)) => a.commit(s, now, cost),
        _ => {}
    }
}

/// Gives `units` back.
pub(super) fn refund(algorithm: &Algorithm, state: &mut State, now: Micros, units: u64) {
    match (algorithm, state) {
        (Algorithm::TokenBucket(a), State::Bucket(s)) => *s = a.refund(*s, now, units),
        (Algorithm::FixedWindow(a), State::Window(s)) => *s = a.refund(*s, now, units),
        (Algorithm::SlidingWindow(a), State::Sliding(s)) => *s = a.refund(*s, now, units),
        (Algorithm::BurstPool(a), State::Pool(s)) => *s = a.refund(*s, now, units),
        (Algorithm::SlidingLog(a), State::Log(s)) => a.refund(s, now, units),
        _ => {}
    }
}

/// The moment `state` equals a fresh key's: its row may be removed from then on.
pub(super) fn expires_at(algorithm: &Algorithm, state: &State) -> Micros {
    match (algorithm, state) {
        (Algorithm::TokenBucket(a), State::Bucket(s)) => a.expires_at(*s),
        (Algorithm::FixedWindow(a), State::Window(s)) => a.expires_at(*s),
        (Algorithm::SlidingWindow(a), State::Sliding(s)) => a.expires_at(*s),
        (Algorithm::BurstPool(a), State::Pool(s)) => a.expires_at(*s),
        (Algorithm::SlidingLog(a), State::Log(s)) => a.expires_at(s),
        _ => 0,
    }
}

/// The key's bytes as rows keep them (a key longer than the longest kept is its digest, as the
/// memory store lists it).
pub(super) fn stored_key(key: &[u8]) -> Vec<u8> {
    KeyValue::new(key).as_bytes().to_vec()
}

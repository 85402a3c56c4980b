//! `Outcomes`: a batch's answer, one outcome per charge.

use std::ops::{Deref, DerefMut};

use smallvec::SmallVec;

use super::{StoreError, StoreErrorKind};
use crate::algorithm::Outcome;

/// The outcomes of a batch, in the order of its charges: what [`Store::apply`](super::Store::apply)
/// answers.
///
/// A list of [`Outcome`]s that holds two without allocating (most requests meet one or two
/// rules). Build one with [`new`](Self::new) and [`push`](Self::push), by collecting an iterator
/// of outcomes, or from a single outcome (`Outcomes::from(outcome)`); read it as a slice
/// (`len`, `iter`, `outcomes[i]`) or take its outcomes with `into_iter`.
///
/// ```
/// use tollgate::algorithm::{Outcome, Verdict};
/// use tollgate::store::Outcomes;
///
/// let mut outcomes = Outcomes::new();
/// outcomes.push(Outcome::new(Verdict::Allowed, 10, 9));
/// outcomes.extend([Outcome::new(Verdict::Allowed, 5, 4)]);
/// assert_eq!(outcomes.len(), 2);
/// assert!(outcomes.iter().all(Outcome::is_allowed));
/// assert_eq!(outcomes[1].remaining, 4);
/// let remaining: Vec<u64> = outcomes.into_iter().map(|o| o.remaining).collect();
/// assert_eq!(remaining, [9, 4]);
/// ```
// A type of its own rather than the `SmallVec` inside: the store contract does not tie its users
// to smallvec's API and versions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcomes(SmallVec<[Outcome; 2]>);

impl Outcomes {
    /// No outcomes.
    pub fn new() -> Self {
        Outcomes(SmallVec::new())
    }

    /// No outcomes, with room for `capacity` (no allocation up to two).
    pub fn with_capacity(capacity: usize) -> Self {
        Outcomes(SmallVec::with_capacity(capacity))
    }

    /// Adds the outcome of the next charge.
    pub fn push(&mut self, outcome: Outcome) {
        self.0.push(outcome);
    }

    /// Takes the last outcome, if any.
    pub fn pop(&mut self) -> Option<Outcome> {
        self.0.pop()
    }

    /// The outcome of a batch of one charge; none is a store's protocol error.
    pub(crate) fn into_first(self) -> Result<Outcome, StoreError> {
        self.into_iter()
            .next()
            .ok_or_else(|| StoreError::new(StoreErrorKind::Protocol, "no outcome for a charge"))
    }
}

impl From<Outcome> for Outcomes {
    /// The outcomes of a batch of one charge.
    fn from(outcome: Outcome) -> Self {
        let mut outcomes = Outcomes::new();
        outcomes.push(outcome);
        outcomes
    }
}

impl Deref for Outcomes {
    type Target = [Outcome];

    fn deref(&self) -> &[Outcome] {
        &self.0
    }
}

impl DerefMut for Outcomes {
    fn deref_mut(&mut self) -> &mut [Outcome] {
        &mut self.0
    }
}

impl FromIterator<Outcome> for Outcomes {
    fn from_iter<I: IntoIterator<Item = Outcome>>(outcomes: I) -> Self {
        Outcomes(outcomes.into_iter().collect())
    }
}

impl Extend<Outcome> for Outcomes {
    fn extend<I: IntoIterator<Item = Outcome>>(&mut self, outcomes: I) {
        self.0.extend(outcomes);
    }
}

impl IntoIterator for Outcomes {
    type Item = Outcome;
    type IntoIter = OutcomesIntoIter;

    fn into_iter(self) -> OutcomesIntoIter {
        OutcomesIntoIter(self.0.into_iter())
    }
}

impl<'a> IntoIterator for &'a Outcomes {
    type Item = &'a Outcome;
    type IntoIter = std::slice::Iter<'a, Outcome>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'a> IntoIterator for &'a mut Outcomes {
    type Item = &'a mut Outcome;
    type IntoIter = std::slice::IterMut<'a, Outcome>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter_mut()
    }
}

/// The outcomes of an [`Outcomes`], taken in order (its `into_iter`).
#[derive(Debug)]
pub struct OutcomesIntoIter(smallvec::IntoIter<[Outcome; 2]>);

impl Iterator for OutcomesIntoIter {
    type Item = Outcome;

    fn next(&mut self) -> Option<Outcome> {
        self.0.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl DoubleEndedIterator for OutcomesIntoIter {
    fn next_back(&mut self) -> Option<Outcome> {
        self.0.next_back()
    }
}

impl ExactSizeIterator for OutcomesIntoIter {}

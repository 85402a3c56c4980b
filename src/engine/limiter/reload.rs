//! Replacing the rules while requests flow, and the layers that follow each replacement.

use crate::engine::ask;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;

use super::{Follower, Inner, Limiter};
use crate::algorithm::error::ConfigError;
use crate::rules::rule::Rule;
use crate::rules::set::{AccessList, RuleSet};

impl Limiter {
    /// The names of the rules in force, in order (for the reload's log line; callers read
    /// [`rules_in_force`](Self::rules_in_force)).
    pub(super) fn rule_names(&self) -> Vec<String> {
        self.inner
            .rules
            .load()
            .rules
            .iter()
            .map(|r| r.name.to_string())
            .collect()
    }

    /// Replaces the rules (and allow and deny lists) atomically: requests in flight finish with
    /// the rules they started with, the next ones use the new set. State lives in the store under
    /// each rule's name, so rules that keep their name keep their counts.
    /// The store may still refuse a rule it cannot decide exactly; then nothing changes.
    pub(super) fn replace(&self, rules: RuleSet) -> Result<(), ConfigError> {
        ask::check_store(&rules, self.store())?;
        let rules = Arc::new(rules);
        {
            // Under the followers' lock: two reloads at once reach every follower in the order
            // they took effect.
            let mut followers = self.followers();
            self.inner.rules.store(rules.clone());
            followers.retain(|follow| follow(&rules));
        }
        tracing::info!(rules = ?self.rule_names(), "rate limit: rules reloaded");
        Ok(())
    }

    /// Has `follow` told of the rule set in force now and of every one that replaces it, in
    /// order, until it answers `false`. The layer keeps what its response and observe stages
    /// prepare per rule set this way (the limiter knows nothing of them).
    pub(crate) fn follow_rules(&self, follow: Follower) {
        let mut followers = self.followers();
        if follow(&self.inner.rules.load_full()) {
            followers.push(follow);
        }
    }

    pub(super) fn followers(&self) -> std::sync::MutexGuard<'_, Vec<Follower>> {
        // A follower that panicked left the list whole: nothing to repair.
        self.inner
            .followers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A limiter deciding under `rules` (validated first), with this limiter's store — its
    /// counts, its circuit breaker, the requests waiting for its slots — its failure policy and
    /// its allow and deny lists. This limiter is left as it is: calls in flight on it finish
    /// under its rules. Rules that keep their name keep their counts, as with
    /// [`reload`](Self::reload).
    ///
    /// For a front end that keeps state of its own beside the rules (`tollgate-server`'s
    /// descriptor trees) and replaces both as one value, so that a call never sees the rules
    /// of one configuration with the state of another.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limit, Limiter, Rule};
    ///
    /// let minute = Duration::from_secs(60);
    /// let two = Rule::new("api", Limit::fixed_window(2, minute));
    /// let before = Limiter::builder().rule(two).build()?;
    /// before.charge("api", "alice", 1).await?;
    /// let after = before.with_rules([Rule::new("api", Limit::fixed_window(5, minute))])?;
    /// // Same store, same name: alice's count is kept.
    /// assert_eq!(after.check("api", "alice", 0).await?.remaining, 4);
    /// assert_eq!(before.check("api", "alice", 0).await?.remaining, 1);
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn with_rules(
        &self,
        rules: impl IntoIterator<Item = Rule>,
    ) -> Result<Limiter, ConfigError> {
        let next = {
            let current = self.rules();
            RuleSet::new(
                rules.into_iter().collect(),
                current.allow().to_vec(),
                current.deny().to_vec(),
            )?
        };
        ask::check_store(&next, self.store())?;
        Ok(Limiter {
            inner: Arc::new(Inner {
                rules: ArcSwap::from_pointee(next),
                ledger: self.inner.ledger.clone(),
                failure: self.inner.failure,
                followers: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Replaces the rules with `rules` (validated first: on error nothing changes).
    pub fn reload(&self, rules: impl IntoIterator<Item = Rule>) -> Result<(), ConfigError> {
        let current = self.inner.rules.load();
        let next = RuleSet::new(
            rules.into_iter().collect(),
            current.allow().to_vec(),
            current.deny().to_vec(),
        )?;
        self.replace(next)
    }

    /// Replaces the rules and the allow and deny lists together, e.g. from a configuration file
    /// that was edited (validated first: on error nothing changes). [`reload`](Self::reload)
    /// keeps the lists in force.
    pub fn reload_with_lists(
        &self,
        rules: impl IntoIterator<Item = Rule>,
        allow: impl IntoIterator<Item = AccessList>,
        deny: impl IntoIterator<Item = AccessList>,
    ) -> Result<(), ConfigError> {
        let next = RuleSet::new(
            rules.into_iter().collect(),
            allow.into_iter().collect(),
            deny.into_iter().collect(),
        )?;
        self.replace(next)
    }
}

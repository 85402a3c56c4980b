//! What operators do to keys: block and unblock them, list the blocked ones, give one a limit of
//! its own for a while (overrides).

use std::time::Duration;

use super::{unknown, LimitError, Limiter};
use crate::algorithm::Limit;
use crate::key::KeyValue;
use crate::rules::set::RuleSet;
use crate::store::{BlockedKey, Cursor, OverrideEntry, Page};

impl Limiter {
    /// Blocks `key` under `rule` for `d` from now, e.g. an admin action or an IP caught stuffing
    /// credentials: every request of the key under the rule is denied until then, with
    /// `Retry-After` = what is left of the block. A block already in force is replaced; the
    /// key's offence count is kept. The rule must have a penalty
    /// ([`Rule::block`](crate::Rule::block)): only such rules read blocks, so the others pay
    /// nothing for them.
    pub async fn block(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        d: Duration,
    ) -> Result<(), LimitError> {
        self.set_block(rule, key.as_ref(), Some(d)).await
    }

    /// Lifts the block of `key` under `rule`, if any, and forgets its offences (the next denial
    /// blocks for the first duration again). The counters are left as they are.
    pub async fn unblock(&self, rule: &str, key: impl AsRef<[u8]>) -> Result<(), LimitError> {
        self.set_block(rule, key.as_ref(), None).await
    }

    pub(super) async fn set_block(
        &self,
        rule: &str,
        key: &[u8],
        block: Option<Duration>,
    ) -> Result<(), LimitError> {
        let key = KeyValue::new(key);
        let pending = {
            let rules = self.rules();
            let (_, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
            let penalty = compiled
                .penalty
                .as_ref()
                .ok_or_else(|| LimitError::NoPenalty(rule.to_owned()))?;
            self.store()
                .set_block(&compiled.name, penalty, key.as_bytes(), block)
        };
        Ok(pending.await?)
    }

    /// Gives `key` under `rule` the limit `limit` for `ttl` from now (a customer raised tenfold
    /// for a day, Upstash's `setDynamicLimit`), replacing any override the key has. It is kept
    /// in the store, so every instance charges the key under it from its next decision; it
    /// takes precedence over the rule's own limit and over one the request brings, is
    /// reported in `RateLimit-Policy`, and the key's state carries over as for any limit
    /// change. The rule must be [`overridable`](crate::Rule::overridable).
    ///
    /// Refused with nothing written: an unknown rule, a rule without overrides, a limit the
    /// rule cannot use (a zero rate or period, another family: a rate for a concurrency rule
    /// or the reverse, numbers the store cannot count), a key longer than
    /// [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN), a TTL of zero or longer than a year.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limit, Limiter, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::new("api", Limit::per_minute(1)).overridable())
    ///     .build()?;
    /// let day = Duration::from_secs(86_400);
    /// limiter.set_override("api", "acme", Limit::per_minute(10), day).await?;
    /// for _ in 0..10 {
    ///     assert!(limiter.charge("api", "acme", 1).await?.is_allowed());
    /// }
    /// assert!(!limiter.charge("api", "acme", 1).await?.is_allowed());
    /// let page = limiter.overrides("api", None).await?;
    /// assert_eq!(page.items[0].key.as_bytes(), b"acme");
    /// limiter.clear_override("api", "acme").await?;
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn set_override(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
        limit: Limit,
        ttl: Duration,
    ) -> Result<(), LimitError> {
        const YEAR: Duration = Duration::from_secs(366 * 86_400);
        let key = key.as_ref();
        let pending = {
            let rules = self.rules();
            let (_, compiled) = overridable(&rules, rule)?;
            let bad = |reason: String| LimitError::BadOverride {
                rule: rule.to_owned(),
                reason,
            };
            if key.len() > crate::key::MAX_KEY_LEN {
                return Err(bad(format!(
                    "a key of {} bytes is longer than {} (MAX_KEY_LEN)",
                    key.len(),
                    crate::key::MAX_KEY_LEN
                )));
            }
            if ttl.is_zero() || ttl > YEAR {
                return Err(bad(format!(
                    "a TTL of {ttl:?} is not between 1 µs and a year"
                )));
            }
            let store = self.store();
            crate::engine::ask::usable(&compiled.name, compiled.algorithm(), &limit, None, store)
                .map_err(bad)?;
            self.store()
                .set_override(&compiled.name, key, Some((&limit, ttl)))
        };
        Ok(pending.await?)
    }

    /// Removes the override of `key` under `rule`, if any: its next decision is under the
    /// rule's own limit (or one the request brings), its state carried over.
    pub async fn clear_override(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<(), LimitError> {
        let pending = {
            let rules = self.rules();
            let (_, compiled) = overridable(&rules, rule)?;
            self.store()
                .set_override(&compiled.name, key.as_ref(), None)
        };
        Ok(pending.await?)
    }

    /// One page of `rule`'s overrides in force (key, limit, time left), at most 100, from
    /// `cursor` on (`None`: from the start); the page's `next` is the cursor of the following
    /// page, `None` after the last. Overrides set or ending during a listing may or may not be
    /// in it; none is listed twice.
    pub async fn overrides(
        &self,
        rule: &str,
        cursor: Option<Cursor>,
    ) -> Result<Page<OverrideEntry>, LimitError> {
        let pending = {
            let rules = self.rules();
            let (_, compiled) = overridable(&rules, rule)?;
            self.store().overrides(&compiled.name, cursor.as_ref(), 100)
        };
        Ok(pending.await?)
    }

    /// The override of `key` under `rule` in force now (its limit and the time it has left), or
    /// `None`. The errors are those of [`overrides`](Self::overrides).
    pub async fn override_of(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<OverrideEntry>, LimitError> {
        let pending = {
            let rules = self.rules();
            let (_, compiled) = overridable(&rules, rule)?;
            self.store().override_of(&compiled.name, key.as_ref())
        };
        Ok(pending.await?)
    }

    /// One page of the keys blocked now under `rule` — by its penalty or by
    /// [`block`](Self::block), through any instance sharing the store — with what is left of
    /// each block by the store's clock. Start with `None`, then give back each page's
    /// [`next`](Page::next) until it is `None`: each call reads a bounded part of the store (at
    /// most 100 keys on the memory store; one `SCAN` step of one node on Redis, never `KEYS`),
    /// so a page may be empty before the end. A key blocked during the whole walk is listed;
    /// one blocked or unblocked meanwhile may or may not be.
    ///
    /// Errors: [`UnknownRule`](LimitError::UnknownRule), [`NoPenalty`](LimitError::NoPenalty)
    /// for a rule that cannot block keys, and the store's errors — among them a cursor the store
    /// did not make ([`StoreErrorKind::BadCursor`](crate::store::StoreErrorKind::BadCursor)), or
    /// a custom store that cannot list blocks (the
    /// [`Store::blocks`](crate::store::Store::blocks) default).
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{Limit, Limiter, Penalty, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(
    ///         Rule::new("login", Limit::per_minute(5))
    ///             .block(Penalty::fixed(Duration::from_secs(600))),
    ///     )
    ///     .build()?;
    /// limiter.block("login", "203.0.113.9", Duration::from_secs(60)).await?;
    /// let mut blocked = Vec::new();
    /// let mut cursor = None;
    /// loop {
    ///     let page = limiter.blocks("login", cursor).await?;
    ///     blocked.extend(page.items);
    ///     match page.next {
    ///         Some(next) => cursor = Some(next),
    ///         None => break,
    ///     }
    /// }
    /// assert_eq!(blocked.len(), 1);
    /// assert_eq!(blocked[0].key, b"203.0.113.9");
    /// assert!(blocked[0].remaining <= Duration::from_secs(60));
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn blocks(
        &self,
        rule: &str,
        cursor: Option<Cursor>,
    ) -> Result<Page<BlockedKey>, LimitError> {
        let pending = {
            let rules = self.rules();
            let name = penalised(&rules, rule)?;
            self.store().blocks(name, cursor.as_ref())
        };
        Ok(pending.await?)
    }

    /// The block of `key` under `rule` if the key is blocked now (with what is left of it, by
    /// the store's clock), or `None`. The errors are those of [`blocks`](Self::blocks).
    pub async fn blocked(
        &self,
        rule: &str,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<BlockedKey>, LimitError> {
        let key = KeyValue::new(key.as_ref());
        let pending = {
            let rules = self.rules();
            let name = penalised(&rules, rule)?;
            self.store().block_of(name, key.as_bytes())
        };
        Ok(pending.await?)
    }
}

/// The rule named `rule`, if it has overrides.
fn overridable<'r>(
    rules: &'r RuleSet,
    rule: &str,
) -> Result<(usize, &'r crate::rules::rule::CompiledRule), LimitError> {
    let (index, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
    if !compiled.overridable {
        return Err(LimitError::NotOverridable(rule.to_owned()));
    }
    Ok((index, compiled))
}

/// The name of `rule` as its store knows it, if it has a penalty (only such rules keep blocks).
fn penalised<'r>(rules: &'r RuleSet, rule: &str) -> Result<&'r str, LimitError> {
    let (_, compiled) = rules.find(rule).ok_or_else(|| unknown(rule))?;
    match compiled.penalty {
        Some(_) => Ok(&compiled.name),
        None => Err(LimitError::NoPenalty(rule.to_owned())),
    }
}

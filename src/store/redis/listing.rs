//! The blocks of a rule, listed a page at a time with `SCAN` (never `KEYS`).
//!
//! A rule's block keys are `<prefix>:block:{<tag>}:<rule>`: one `SCAN <cursor> MATCH
//! <prefix>:block:{*}:<rule> COUNT 100` step finds some of them, and one pipeline of `TIME` and a
//! `GET` per key found reads their blocks and the server's clock, so what is left of each block is
//! counted by the clock that wrote it. On a cluster every master is scanned in turn (ordered by
//! the first slot it serves, found with `CLUSTER SLOTS`), each step's commands sent to the master
//! holding that slot. The cursor names the scan's place: `r<scan cursor>` on one server,
//! `c<slot>.<scan cursor>` on a cluster, then `.<n>` when earlier pages listed the first `n` names
//! of that step (the overrides' listing splits a step over pages of a requested size).

use ::redis::{Pipeline, Value};

use super::{conn, keys, Inner};
use crate::algorithm::{duration, Micros};
use crate::store::{BlockedKey, Cursor, Page, StoreError, StoreErrorKind};

/// The `COUNT` of each `SCAN` step: how many keys of the node one page looks at, roughly.
const COUNT: u64 = 100;

/// Where a walk is: the node (on a cluster, by the first slot its master serves), the node's
/// own `SCAN` cursor, and how many of that step's names (sorted) earlier pages listed. One type
/// for every listing of the store (blocks, overrides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct At {
    pub(super) slot: Option<u16>,
    pub(super) scan: u64,
    pub(super) skip: usize,
}

impl At {
    /// The start of a step: `scan` on the node of `slot`, nothing of it listed yet.
    fn step(slot: Option<u16>, scan: u64) -> At {
        At {
            slot,
            scan,
            skip: 0,
        }
    }

    /// The cursor naming this place.
    pub(super) fn cursor(self) -> Cursor {
        let mut text = match self.slot {
            Some(slot) => format!("c{slot}.{}", self.scan),
            None => format!("r{}", self.scan),
        };
        if self.skip > 0 {
            text.push_str(&format!(".{}", self.skip));
        }
        Cursor::new(text)
    }

    fn read(cursor: &Cursor, cluster: bool) -> Result<At, StoreError> {
        let bad = || {
            StoreError::new(
                StoreErrorKind::BadCursor,
                format!("{cursor:?} is not a cursor of this Redis store's listings"),
            )
        };
        let text = cursor.as_str();
        let (slot, rest) = match (cluster, text.split_at_checked(1)) {
            (true, Some(("c", rest))) => {
                let (slot, rest) = rest.split_once('.').ok_or_else(bad)?;
                let slot: u16 = slot.parse().map_err(|_| bad())?;
                if slot >= 16_384 {
                    return Err(bad());
                }
                (Some(slot), rest)
            }
            (false, Some(("r", rest))) => (None, rest),
            _ => return Err(bad()),
        };
        let (scan, skip) = match rest.split_once('.') {
            Some((scan, skip)) => (scan, skip.parse().map_err(|_| bad())?),
            None => (rest, 0),
        };
        Ok(At {
            slot,
            scan: scan.parse().map_err(|_| bad())?,
            skip,
        })
    }
}

impl Inner {
    /// One page of the keys blocked now under `rule`; see
    /// [`Store::blocks`](crate::store::Store::blocks).
    pub(super) async fn list_blocks(
        &self,
        rule: &str,
        cursor: Option<&Cursor>,
    ) -> Result<Page<BlockedKey>, StoreError> {
        let mut masters = None;
        let Some(at) = self.walk_from(cursor, &mut masters).await? else {
            return Ok(Page::new(Vec::new(), None));
        };
        let (next, mut listed) = self.scan_step(at.scan, at.slot, "block", rule).await?;
        listed.drain(..at.skip.min(listed.len()));
        let names: Vec<&[u8]> = listed.iter().map(|(_, name)| name.as_slice()).collect();
        let (now, blocks) = self.read_blocks(&names, at.slot).await?;
        let items = listed
            .into_iter()
            .zip(blocks)
            .filter_map(|((key, _), block)| blocked_now(key, block?, now))
            .collect();
        let next = self.after_step(at, next, &mut masters).await?;
        Ok(Page::new(items, next.map(At::cursor)))
    }

    /// The place a walk starts from: the one `cursor` names, or the first node's start (`None`
    /// when a cluster has no master). `masters` caches `CLUSTER SLOTS` for the call.
    pub(super) async fn walk_from(
        &self,
        cursor: Option<&Cursor>,
        masters: &mut Option<Vec<u16>>,
    ) -> Result<Option<At>, StoreError> {
        let cluster = self.is_cluster();
        Ok(match cursor {
            Some(cursor) => Some(At::read(cursor, cluster)?),
            None if cluster => self
                .masters(masters)
                .await?
                .first()
                .map(|&slot| At::step(Some(slot), 0)),
            None => Some(At::step(None, 0)),
        })
    }

    /// The place after the step at `at`, whose `SCAN` answered `next`: the same node's next
    /// step, the next master's first (ordered by first slot), or `None` when the walk is over.
    pub(super) async fn after_step(
        &self,
        at: At,
        next: u64,
        masters: &mut Option<Vec<u16>>,
    ) -> Result<Option<At>, StoreError> {
        Ok(match (next, at.slot) {
            (0, None) => None,
            (0, Some(slot)) => {
                let masters = self.masters(masters).await?;
                masters
                    .iter()
                    .find(|&&s| s > slot)
                    .map(|&slot| At::step(Some(slot), 0))
            }
            (scan, slot) => Some(At::step(slot, scan)),
        })
    }

    /// One `SCAN <scan> MATCH <prefix>:<kind>:{*}:<rule> COUNT 100` step on the node of `slot`:
    /// the next scan cursor, and the keys found (each with its key name), sorted, each once.
    pub(super) async fn scan_step(
        &self,
        scan: u64,
        slot: Option<u16>,
        kind: &str,
        rule: &str,
    ) -> Result<(u64, Vec<(Vec<u8>, Vec<u8>)>), StoreError> {
        let mut cmd = ::redis::cmd("SCAN");
        cmd.arg(scan)
            .arg("MATCH")
            .arg(pattern(&self.prefix, kind, rule))
            .arg("COUNT")
            .arg(COUNT);
        let reply = self.conn.clone().query_node(&cmd, slot).await;
        let (next, found): (String, Vec<Vec<u8>>) =
            ::redis::from_redis_value(reply.map_err(conn::error)?)
                .map_err(|e| protocol(format!("SCAN answered {e}")))?;
        let next: u64 = next
            .parse()
            .map_err(|_| protocol(format!("SCAN answered the cursor {next:?}")))?;
        let mut listed: Vec<(Vec<u8>, Vec<u8>)> = found
            .into_iter()
            .filter_map(|name| Some((key_of(&name, &self.prefix, kind, rule)?, name)))
            .collect();
        // SCAN may return a key twice, within a step as across steps.
        listed.sort_unstable();
        listed.dedup();
        Ok((next, listed))
    }

    /// The block of `key` under `rule`, if it is blocked now.
    pub(super) async fn block_now(
        &self,
        rule: &str,
        key: &[u8],
    ) -> Result<Option<BlockedKey>, StoreError> {
        let name = keys::block_name(&self.prefix, rule, key);
        let slot = self.is_cluster().then(|| keys::slot(&name));
        let (now, mut blocks) = self.read_blocks(&[&name], slot).await?;
        Ok(blocks
            .pop()
            .flatten()
            .and_then(|block| blocked_now(key.to_vec(), block, now)))
    }

    /// The time (the injected clock's in test mode, the server's otherwise) and the block
    /// (`until`, `offences`) each of `names` holds, read in one pipeline on the node of `slot`.
    async fn read_blocks(
        &self,
        names: &[&[u8]],
        slot: Option<u16>,
    ) -> Result<(Micros, Vec<Option<(Micros, u64)>>), StoreError> {
        let (now, answers) = self.time_and_values(names, slot).await?;
        Ok((now, answers.map(read_block).collect()))
    }

    /// The time (the injected clock's in test mode, the server's `TIME` otherwise) and the
    /// answer to a `GET` of each of `names`, in one pipeline on the node of `slot`: what a
    /// listing's page reads (blocks and overrides alike).
    pub(super) async fn time_and_values(
        &self,
        names: &[&[u8]],
        slot: Option<u16>,
    ) -> Result<(Micros, std::vec::IntoIter<Value>), StoreError> {
        if names.is_empty() {
            return Ok((0, Vec::new().into_iter()));
        }
        let injected = self.injected_now()?;
        let mut pipe = Pipeline::new();
        if injected.is_none() {
            pipe.cmd("TIME");
        }
        for name in names {
            pipe.cmd("GET").arg(*name);
        }
        let mut answers = self
            .conn
            .clone()
            .pipeline_on(pipe, slot)
            .await
            .map_err(conn::error)?
            .into_iter();
        let now = match injected {
            Some(now) => now,
            None => server_time(answers.next())?,
        };
        Ok((now, answers))
    }

    /// The masters of a cluster, each by the first slot it serves, in slot order (asked once
    /// per call, with `CLUSTER SLOTS`).
    pub(super) async fn masters<'m>(
        &self,
        masters: &'m mut Option<Vec<u16>>,
    ) -> Result<&'m [u16], StoreError> {
        if masters.is_none() {
            let mut slots = ::redis::cmd("CLUSTER");
            slots.arg("SLOTS");
            let reply = self
                .conn
                .clone()
                .query_node(&slots, None)
                .await
                .map_err(conn::error)?;
            *masters = Some(first_slots(reply)?);
        }
        Ok(masters.as_deref().unwrap_or_default())
    }
}

/// The server's time (µs) from its answer to `TIME`.
pub(super) fn server_time(answer: Option<Value>) -> Result<Micros, StoreError> {
    let time = answer.ok_or_else(|| protocol("no answer to TIME"))?;
    let (seconds, micros): (u64, u64) =
        ::redis::from_redis_value(time).map_err(|e| protocol(format!("TIME answered {e}")))?;
    Ok(seconds.saturating_mul(1_000_000).saturating_add(micros))
}

/// The first slot each master serves, sorted, from a `CLUSTER SLOTS` answer: ranges of
/// `[start, end, [host, port, id…], replicas…]`.
fn first_slots(reply: Value) -> Result<Vec<u16>, StoreError> {
    let bad = || protocol("CLUSTER SLOTS answered something else than slot ranges");
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let mut firsts: Vec<(Vec<u8>, i64, u16)> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad());
        };
        let (Some(Value::Int(start)), Some(Value::Array(master))) = (parts.first(), parts.get(2))
        else {
            return Err(bad());
        };
        let host = match master.first() {
            Some(Value::BulkString(host)) => host.clone(),
            Some(Value::SimpleString(host)) => host.clone().into_bytes(),
            _ => return Err(bad()),
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return Err(bad());
        };
        let start = u16::try_from(*start).map_err(|_| bad())?;
        match firsts.iter_mut().find(|(h, p, _)| *h == host && p == port) {
            Some(first) => first.2 = first.2.min(start),
            None => firsts.push((host, *port, start)),
        }
    }
    let mut slots: Vec<u16> = firsts.into_iter().map(|(_, _, slot)| slot).collect();
    slots.sort_unstable();
    Ok(slots)
}

/// A `GET` of a block key: `until,offences`, or nothing.
fn read_block(value: Value) -> Option<(Micros, u64)> {
    let Value::BulkString(raw) = value else {
        return None;
    };
    let text = std::str::from_utf8(&raw).ok()?;
    let (until, offences) = text.split_once(',')?;
    Some((until.parse().ok()?, offences.parse().ok()?))
}

fn blocked_now(key: Vec<u8>, (until, offences): (Micros, u64), now: Micros) -> Option<BlockedKey> {
    (until > now).then(|| BlockedKey::new(key, duration(until - now), offences))
}

/// The `MATCH` pattern of `rule`'s keys of `kind` (`block`, `override`): the prefix and the rule
/// with glob characters escaped.
fn pattern(prefix: &str, kind: &str, rule: &str) -> Vec<u8> {
    let mut pattern = Vec::with_capacity(prefix.len() + kind.len() + rule.len() + 16);
    escape(&mut pattern, prefix.as_bytes());
    pattern.push(b':');
    pattern.extend_from_slice(kind.as_bytes());
    pattern.extend_from_slice(b":{*}:");
    escape(&mut pattern, rule.as_bytes());
    pattern
}

fn escape(into: &mut Vec<u8>, text: &[u8]) {
    for &b in text {
        if matches!(b, b'*' | b'?' | b'[' | b']' | b'\\') {
            into.push(b'\\');
        }
        into.push(b);
    }
}

/// The key whose block (or override: `kind`) `name` holds, if `name` is such a key of `rule`
/// (the pattern's `*` may also match names of other rules whose names end like this one's).
fn key_of(name: &[u8], prefix: &str, kind: &str, rule: &str) -> Option<Vec<u8>> {
    let rest = name
        .strip_prefix(prefix.as_bytes())?
        .strip_prefix(b":")?
        .strip_prefix(kind.as_bytes())?
        .strip_prefix(b":{")?;
    let close = rest.iter().position(|&b| b == b'}')?;
    let (tag, after) = (&rest[..close], &rest[close + 1..]);
    if after.strip_prefix(b":")? != rule.as_bytes() || tag.contains(&b'|') {
        return None;
    }
    match tag.strip_prefix(b"=") {
        None => Some(tag.to_vec()),
        Some(hex) => {
            if hex.len() % 2 != 0 {
                return None;
            }
            hex.chunks(2)
                .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
                .collect()
        }
    }
}

fn protocol(message: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Protocol, message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_names_read_back_to_their_keys() {
        for key in [
            &b"10.0.0.1"[..],
            b"",
            b"a{b}",
            b"=x",
            b"caf\xc3\xa9",
            b"\xff\x00",
        ] {
            let name = keys::block_name("tg", "login", key);
            assert_eq!(key_of(&name, "tg", "block", "login").as_deref(), Some(key));
            assert_eq!(key_of(&name, "tg", "block", "gin"), None);
            assert_eq!(key_of(&name, "t", "block", "login"), None);
        }
        // A rule whose name ends like another's, and counters beside blocks, are not listed.
        let other = keys::block_name("tg", "x}:login", b"k");
        assert_eq!(key_of(&other, "tg", "block", "login"), None);
        assert_eq!(
            key_of(
                &keys::key_name("tg", "login", b"k", None),
                "tg",
                "block",
                "login"
            ),
            None
        );
    }

    #[test]
    fn patterns_escape_glob_characters() {
        assert_eq!(pattern("tg", "block", "login"), b"tg:block:{*}:login");
        assert_eq!(pattern("tg", "override", "login"), b"tg:override:{*}:login");
        assert_eq!(
            pattern("a*b", "block", "r?[x]\\"),
            b"a\\*b:block:{*}:r\\?\\[x\\]\\\\"
        );
    }

    #[test]
    fn cursors_read_back_and_foreign_ones_are_refused() {
        for (at, cluster, text) in [
            (At::step(None, 0), false, "r0"),
            (At::step(None, u64::MAX), false, "r18446744073709551615"),
            (At::step(Some(5461), 17), true, "c5461.17"),
            (
                At {
                    slot: None,
                    scan: 3,
                    skip: 100,
                },
                false,
                "r3.100",
            ),
            (
                At {
                    slot: Some(0),
                    scan: 0,
                    skip: 7,
                },
                true,
                "c0.0.7",
            ),
        ] {
            assert_eq!(at.cursor().as_str(), text);
            assert_eq!(At::read(&at.cursor(), cluster).unwrap(), at);
        }
        for (text, cluster) in [
            ("m1", false),
            ("r", false),
            ("r1.x", false),
            ("c1.2", false),
            ("r3", true),
            ("c16384.0", true),
            ("c1", true),
            ("\u{ff}", false),
            ("", true),
        ] {
            let error = At::read(&Cursor::new(text), cluster).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::BadCursor, "{text:?}");
        }
    }

    #[test]
    fn masters_are_ordered_by_their_first_slot() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |start: i64, end: i64, master: Value| {
            Value::Array(vec![Value::Int(start), Value::Int(end), master])
        };
        let reply = Value::Array(vec![
            range(10_923, 16_383, node("127.0.0.1", 7002)),
            range(5_461, 10_000, node("127.0.0.1", 7001)),
            range(0, 5_460, node("127.0.0.1", 7000)),
            range(10_001, 10_922, node("127.0.0.1", 7000)),
        ]);
        assert_eq!(first_slots(reply).unwrap(), [0, 5_461, 10_923]);
        assert!(first_slots(Value::Nil).is_err());
    }
}

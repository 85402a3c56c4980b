//! What a row holds, as bytes: a key's counter state, its block, its override.
//!
//! Every number is a little-endian 64-bit integer behind a one-byte tag, so a row written by one
//! version of the crate is read by the next or refused as a `Protocol` error, never misread.

use crate::algorithm::{
    Algorithm, Block, BurstPoolState, FixedWindowState, Limit, Micros, SlidingLogState,
    SlidingWindowState,
};
use crate::store::{StoreError, StoreErrorKind};

/// A key's counter state under one algorithm (concurrency limits are not kept in rows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum State {
    Bucket(i64),
    Window(FixedWindowState),
    Sliding(SlidingWindowState),
    Pool(BurstPoolState),
    Log(SlidingLogState),
}

const BUCKET: u8 = 1;
const WINDOW: u8 = 2;
const SLIDING: u8 = 3;
const POOL: u8 = 4;
const LOG: u8 = 5;
const BLOCK: u8 = 16;
const OVERRIDE: u8 = 17;

impl State {
    /// Whether this state is one `algorithm` keeps (a rule that changed its algorithm under the
    /// same name starts over, as in the memory store).
    pub(super) fn fits(&self, algorithm: &Algorithm) -> bool {
        matches!(
            (algorithm, self),
            (Algorithm::TokenBucket(_), State::Bucket(_))
                | (Algorithm::FixedWindow(_), State::Window(_))
                | (Algorithm::SlidingWindow(_), State::Sliding(_))
                | (Algorithm::BurstPool(_), State::Pool(_))
                | (Algorithm::SlidingLog(_), State::Log(_))
        )
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Words::new();
        match self {
            State::Bucket(empty_at) => out.tag(BUCKET).signed(*empty_at),
            State::Window(s) => out.tag(WINDOW).word(s.window_start).word(s.spent),
            State::Sliding(s) => out
                .tag(SLIDING)
                .word(s.window_start)
                .word(s.current)
                .word(s.previous),
            State::Pool(s) => out.tag(POOL).signed(s.steady).signed(s.pool),
            State::Log(s) => {
                out.tag(LOG);
                for (at, units) in s.entries() {
                    out.word(at).word(units);
                }
                &mut out
            }
        };
        out.0
    }

    pub(super) fn decode(raw: &[u8]) -> Result<State, StoreError> {
        let (tag, words) = read(raw)?;
        let state = match (tag, words.as_slice()) {
            (BUCKET, &[e]) => State::Bucket(e as i64),
            (WINDOW, &[window_start, spent]) => State::Window(FixedWindowState {
                window_start,
                spent,
            }),
            (SLIDING, &[window_start, current, previous]) => State::Sliding(SlidingWindowState {
                window_start,
                current,
                previous,
            }),
            (POOL, &[steady, pool]) => State::Pool(BurstPoolState {
                steady: steady as i64,
                pool: pool as i64,
            }),
            (LOG, words) if words.len() % 2 == 0 => State::Log(SlidingLogState::from_entries(
                words.chunks_exact(2).map(|pair| (pair[0], pair[1])),
            )),
            _ => return Err(malformed("a counter")),
        };
        Ok(state)
    }
}

pub(super) fn encode_block(block: &Block) -> Vec<u8> {
    let mut out = Words::new();
    out.tag(BLOCK).word(block.until).word(block.offences);
    out.0
}

pub(super) fn decode_block(raw: &[u8]) -> Result<Block, StoreError> {
    match read(raw)? {
        (BLOCK, words) if words.len() == 2 => Ok(Block {
            until: words[0],
            offences: words[1],
        }),
        _ => Err(malformed("a block")),
    }
}

/// An override: when it ends, then the limit as the shared words of an override.
pub(super) fn encode_override(limit: &Limit, until: Micros) -> Vec<u8> {
    let mut out = Words::new();
    out.tag(OVERRIDE).word(until);
    for word in crate::store::overrides::limit_words(limit.algorithm()) {
        out.word(word);
    }
    out.0
}

pub(super) fn decode_override(raw: &[u8]) -> Result<(Micros, Limit), StoreError> {
    let (tag, words) = read(raw)?;
    let limit = match (tag, words.split_first()) {
        (OVERRIDE, Some((&until, rest))) => {
            crate::store::overrides::limit_from_words(rest).map(|limit| (until, limit))
        }
        _ => None,
    };
    // A limit that would not pass the checks a set passes is no limit to charge under.
    limit
        .filter(|(_, limit)| limit.check("override").is_ok())
        .ok_or_else(|| malformed("an override"))
}

struct Words(Vec<u8>);

impl Words {
    fn new() -> Self {
        Words(Vec::with_capacity(25))
    }

    fn tag(&mut self, tag: u8) -> &mut Self {
        self.0.push(tag);
        self
    }

    fn word(&mut self, word: u64) -> &mut Self {
        self.0.extend_from_slice(&word.to_le_bytes());
        self
    }

    fn signed(&mut self, word: i64) -> &mut Self {
        self.0.extend_from_slice(&word.to_le_bytes());
        self
    }
}

fn read(raw: &[u8]) -> Result<(u8, Vec<u64>), StoreError> {
    let Some((&tag, rest)) = raw.split_first() else {
        return Err(malformed("an empty row"));
    };
    if rest.len() % 8 != 0 {
        return Err(malformed("a row's length"));
    }
    let words = rest
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
        .collect();
    Ok((tag, words))
}

fn malformed(what: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Protocol,
        format!("{what} read from the database is malformed"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_reads_back() {
        let states = [
            State::Bucket(-5),
            State::Window(FixedWindowState {
                window_start: 7,
                spent: 3,
            }),
            State::Sliding(SlidingWindowState {
                window_start: 1,
                current: 2,
                previous: 3,
            }),
            State::Pool(BurstPoolState {
                steady: i64::MIN,
                pool: 9,
            }),
            State::Log(SlidingLogState::from_entries([(1, 2), (3, 4)])),
        ];
        for state in states {
            assert_eq!(State::decode(&state.encode()).unwrap(), state);
        }
        let block = Block {
            until: 10,
            offences: 2,
        };
        assert_eq!(decode_block(&encode_block(&block)).unwrap(), block);
        let limit = Limit::per_minute(7);
        let (until, back) = decode_override(&encode_override(&limit, 99)).unwrap();
        assert_eq!((until, back.algorithm()), (99, limit.algorithm()));
    }

    #[test]
    fn malformed_rows_are_errors() {
        for raw in [
            &[][..],
            &[BUCKET, 1, 2][..],
            &[WINDOW, 0, 0, 0, 0, 0, 0, 0, 0][..],
        ] {
            assert_eq!(
                State::decode(raw).unwrap_err().kind(),
                StoreErrorKind::Protocol
            );
        }
        assert!(decode_block(&[OVERRIDE]).is_err());
    }
}

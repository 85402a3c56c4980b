//! The store's Lua: one script per operation, each put together at build time from the parts
//! beside this file (every part opens with a comment saying what it does). Each script is sent by
//! its own hash (`EVALSHA`), and loaded again by the connection after `NOSCRIPT`; each request is
//! still one call of one script.
//!
//! | script | sent for | parts, after `header.lua` |
//! |---|---|---|
//! | [`BUCKET_NOW`], [`BUCKET_AT`] | a token bucket's charge of one key (`fast.rs`), on the server's time or a test clock's | `fast.lua`, `fast_bucket_now.lua` or `fast_bucket_at.lua`, `fast_bucket.lua` |
//! | [`SLIDING`], [`FIXED`] | a sliding or fixed window's charge of one key (`fast.rs`) | `fast.lua`, `fast_sliding.lua` or `fast_fixed.lua` |
//! | [`CHARGE`] | any other charge: a batch, all or nothing | the time, the algorithms, `records.lua`, `overrides.lua`, `decide.lua`, `charge.lua` |
//! | [`CHECK`] | a cross-slot batch's later slots after a denial | as the charge, ending in `check.lua` |
//! | [`REFUND`] | `Store::refund` | the time, the algorithms, `records.lua`, `settle.lua`, `refund.lua` |
//! | [`UNDO`] | a cross-slot batch's earlier slots after a denial | as the refund, ending in `undo.lua` |
//! | [`BLOCK`] | `Store::set_block` | the time, `integers.lua`, `blocks.lua`, `block.lua` |
//! | [`OVERRIDE`] | `Store::set_override` | the time, `integers.lua`, `override.lua` |
//! | [`LEASE`] | renewing concurrency leases (`leases.rs`) | `lease.lua` alone |
//!
//! The algorithms' parts are `integers.lua`, `blocks.lua` (deciding only), `numbers.lua`,
//! `token_bucket.lua`, `calendar.lua`, `fixed_window.lua`, `sliding_window.lua`,
//! `sliding_log.lua`, `burst_pool.lua` and `slots.lua` (concurrency leases). A reset needs no
//! script: it deletes the rule's keys and its block key (`DEL`); a lease given back is a `ZREM`;
//! an override cleared is a `DEL`.

use ::redis::Script;

/// The opening of every script that runs the algorithms: the time and exact division.
macro_rules! time {
    () => {
        concat!(
            include_str!("header.lua"),
            include_str!("time.lua"),
            include_str!("integers.lua"),
        )
    };
}

/// Every algorithm, and reading, saving and answering a call's records.
macro_rules! algorithms {
    () => {
        concat!(
            include_str!("numbers.lua"),
            include_str!("token_bucket.lua"),
            include_str!("calendar.lua"),
            include_str!("fixed_window.lua"),
            include_str!("sliding_window.lua"),
            include_str!("sliding_log.lua"),
            include_str!("burst_pool.lua"),
            include_str!("slots.lua"),
            include_str!("records.lua"),
        )
    };
}

/// A token bucket's charge of one key on the server's time.
pub(crate) const BUCKET_NOW: &str = concat!(
    include_str!("header.lua"),
    include_str!("fast.lua"),
    include_str!("fast_bucket_now.lua"),
    include_str!("fast_bucket.lua"),
);

/// A token bucket's charge of one key on a time the caller sends (a test clock).
pub(super) const BUCKET_AT: &str = concat!(
    include_str!("header.lua"),
    include_str!("fast.lua"),
    include_str!("fast_bucket_at.lua"),
    include_str!("fast_bucket.lua"),
);

/// A sliding window's charge of one key.
pub(crate) const SLIDING: &str = concat!(
    include_str!("header.lua"),
    include_str!("fast.lua"),
    include_str!("fast_sliding.lua"),
);

/// A fixed window's charge of one key.
pub(crate) const FIXED: &str = concat!(
    include_str!("header.lua"),
    include_str!("fast.lua"),
    include_str!("fast_fixed.lua"),
);

/// A batch decided and charged, all or nothing.
pub(super) const CHARGE: &str = concat!(
    time!(),
    include_str!("blocks.lua"),
    algorithms!(),
    include_str!("overrides.lua"),
    include_str!("decide.lua"),
    include_str!("charge.lua"),
);

/// A batch decided, nothing charged.
pub(super) const CHECK: &str = concat!(
    time!(),
    include_str!("blocks.lua"),
    algorithms!(),
    include_str!("overrides.lua"),
    include_str!("decide.lua"),
    include_str!("check.lua"),
);

/// Units given back.
pub(super) const REFUND: &str = concat!(
    time!(),
    algorithms!(),
    include_str!("settle.lua"),
    include_str!("refund.lua"),
);

/// Earlier charges taken back exactly.
pub(super) const UNDO: &str = concat!(
    time!(),
    algorithms!(),
    include_str!("settle.lua"),
    include_str!("undo.lua"),
);

/// A key blocked for a while.
pub(super) const BLOCK: &str = concat!(
    time!(),
    include_str!("blocks.lua"),
    include_str!("block.lua")
);

/// A key's override set.
pub(super) const OVERRIDE: &str = concat!(time!(), include_str!("override.lua"));

/// Concurrency leases renewed.
pub(super) const LEASE: &str = include_str!("lease.lua");

/// A script as the store sends it: by its hash (`EVALSHA`), or by its source (`EVAL`) to a server
/// that does not know it.
#[derive(Clone)]
pub(super) struct Lua {
    source: &'static str,
    script: Script,
}

impl Lua {
    pub(super) fn new(source: &'static str) -> Lua {
        Lua {
            source,
            script: Script::new(source),
        }
    }

    /// The SHA-1 that `EVALSHA` names it by.
    pub(super) fn hash(&self) -> &str {
        self.script.get_hash()
    }

    pub(super) fn source(&self) -> &'static str {
        self.source
    }

    pub(super) fn script(&self) -> &Script {
        &self.script
    }
}

/// The scripts a store sends with `EVALSHA`, each hashed once. (The lease renewal has its own,
/// in `leases.rs`: only stores with concurrency rules send it.)
pub(super) struct Scripts {
    pub(super) bucket_now: Lua,
    pub(super) bucket_at: Lua,
    pub(super) sliding: Lua,
    pub(super) fixed: Lua,
    pub(super) charge: Lua,
    pub(super) check: Lua,
    pub(super) refund: Lua,
    pub(super) undo: Lua,
    pub(super) block: Lua,
    pub(super) set_override: Lua,
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        Scripts {
            bucket_now: Lua::new(BUCKET_NOW),
            bucket_at: Lua::new(BUCKET_AT),
            sliding: Lua::new(SLIDING),
            fixed: Lua::new(FIXED),
            charge: Lua::new(CHARGE),
            check: Lua::new(CHECK),
            refund: Lua::new(REFUND),
            undo: Lua::new(UNDO),
            block: Lua::new(BLOCK),
            set_override: Lua::new(OVERRIDE),
        }
    }

    /// Every one, to load when the store connects.
    pub(super) fn all(&self) -> [&Lua; 10] {
        [
            &self.bucket_now,
            &self.bucket_at,
            &self.sliding,
            &self.fixed,
            &self.charge,
            &self.check,
            &self.refund,
            &self.undo,
            &self.block,
            &self.set_override,
        ]
    }
}

#[cfg(test)]
mod tests {
    /// Every part in this folder is in a script, opens with a comment saying what it does, and
    /// ends its last line (so that no two parts share a line once put together).
    #[test]
    fn every_part_is_in_a_script_opens_with_a_comment_and_ends_its_last_line() {
        // (Imported here: the Redis bench includes this file, without running its tests.)
        use super::*;
        use std::path::Path;

        let scripts = [
            BUCKET_NOW, BUCKET_AT, SLIDING, FIXED, CHARGE, CHECK, REFUND, UNDO, BLOCK, OVERRIDE,
            LEASE,
        ];
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/redis/lua");
        let mut parts = 0;
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "lua") {
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.starts_with("-- "), "{name} opens with a comment");
            assert!(text.ends_with('\n'), "{name} ends its last line");
            assert!(
                scripts.iter().any(|s| s.contains(&text)),
                "{name} is in no script"
            );
            parts += 1;
        }
        assert!(parts > 20, "{parts} parts");
    }
}

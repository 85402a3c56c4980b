//! One script call: its command (the keys, then every number packed as little-endian doubles),
//! sent, and its reply read (`reply`).

use ::redis::Cmd;

use super::params::{self, push_now, Packed};
use super::record::{Item, Op, Taken};
use super::reply::{self, Applied};
use super::{conn, Inner};
use crate::algorithm::{Micros, Outcome};
use crate::store::StoreError;

impl Inner {
    /// One script call; the outcome of each item, with the candidate it chose, and the
    /// override each item was decided under (deciding only).
    pub(super) async fn call(
        &self,
        op: Op,
        now: Option<Micros>,
        items: &[Item<'_>],
    ) -> Result<(Vec<(Outcome, Taken)>, Applied), StoreError> {
        let cmd = self.command(op, now, items);
        let mut conn = self.conn.clone();
        let reply: Vec<u8> = conn
            .eval(op.script(&self.scripts), &cmd)
            .await
            .map_err(conn::error)?;
        reply::decode(&reply, items, op.decides())
    }

    fn command<'r>(&self, op: Op, now: Option<Micros>, items: &[Item<'r>]) -> Cmd {
        let candidates = || items.iter().flat_map(|item| item.candidates());
        // Blocks are read when deciding, never by refunds and undos.
        let deciding = op.decides();
        let penalty = |item: &Item<'r>| item.record.penalty.as_ref().filter(|_| deciding);
        let blocks = || items.iter().filter_map(penalty);
        // Overrides too are read when deciding only.
        let overrides = || {
            items
                .iter()
                .filter_map(|item| item.record.overrides.as_ref().filter(|_| deciding))
        };
        let keys = candidates().count() + blocks().count() + overrides().count();
        let names: usize = candidates().map(|c| c.name.len()).sum::<usize>()
            + blocks().map(|(name, _)| name.len()).sum::<usize>()
            + overrides().map(|o| o.name.len()).sum::<usize>();
        let numbers = 3
            + 8 * items.len()
            + candidates().map(|c| c.args.len()).sum::<usize>()
            + blocks().map(|(_, args)| args.len()).sum::<usize>();
        // Sized once: EVALSHA, the hash, the key count, the names and the numbers.
        let mut cmd = Cmd::with_capacity(4 + keys, 64 + names + 8 * numbers);
        cmd.arg("EVALSHA")
            .arg(op.script(&self.scripts).hash())
            .arg(keys);
        for item in items {
            for candidate in item.candidates() {
                cmd.arg(&candidate.name);
            }
            if let Some((name, _)) = penalty(item) {
                cmd.arg(name);
            }
            if let Some(overrides) = item.record.overrides.as_ref().filter(|_| deciding) {
                cmd.arg(&overrides.name);
            }
        }
        // Every number as one string of little-endian doubles, exact below 2^53 (the script
        // reads them with one `struct.unpack` instead of one `tonumber` each).
        let mut packed = Packed(Vec::with_capacity(8 * numbers));
        push_now(&mut packed, now);
        packed.push(items.len() as u64);
        for item in items {
            let candidates = item.candidates();
            packed.push(candidates.len() as u64);
            packed.push(params::mode_code(item.mode));
            packed.push(params::units_arg(item.cost));
            // Deciding, the five undo numbers give way to the penalty's count (0: none) and
            // whether the rule has overrides.
            match (deciding, penalty(item)) {
                (true, found) => {
                    packed.push(found.map_or(0, |(_, args)| args.len() as u64));
                    packed.push(u64::from(item.record.overrides.is_some()));
                    packed.0.extend_from_slice(&[0; 24]);
                }
                (false, _) => {
                    packed.push(item.undo.steady);
                    packed.push(item.undo.at);
                    packed.push(u64::from(item.undo.missing));
                    packed.push_signed(item.undo.found[0]);
                    packed.push_signed(item.undo.found[1]);
                }
            }
            for candidate in candidates {
                for &value in &candidate.args {
                    packed.push(value);
                }
            }
            if let Some((_, args)) = penalty(item) {
                for &value in args {
                    packed.push(value);
                }
            }
        }
        cmd.arg(packed.0.as_slice());
        cmd
    }
}

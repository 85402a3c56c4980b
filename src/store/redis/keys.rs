//! Redis key names and Redis Cluster slots.
//!
//! A key is named `<prefix>:{<tag>}:<rule>`, where the hash tag is the key value itself: every rule
//! that counts by the same value (a client IP, a user id) lands in the same cluster slot, so a
//! request charging several of them is still one script call. The tag is the value's bytes when
//! they are safe inside braces, `=` and their hex digits otherwise (empty, or containing `{`, `}`
//! or `|`, or starting with `=`), so the name is injective: the rule follows the tag's closing
//! brace and may hold any character. Shard `i` of a sharded rule appends `|i` inside the tag, which
//! moves each shard to its own slot.

/// The name of the Redis key holding `(rule, key)` (shard `shard` of a sharded rule).
pub(super) fn key_name(prefix: &str, rule: &str, key: &[u8], shard: Option<u32>) -> Vec<u8> {
    let mut name = Vec::with_capacity(prefix.len() + rule.len() + 2 * key.len() + 16);
    name.extend_from_slice(prefix.as_bytes());
    name.extend_from_slice(b":{");
    if is_plain(key) {
        name.extend_from_slice(key);
    } else {
        name.push(b'=');
        for &b in key {
            name.push(HEX[usize::from(b >> 4)]);
            name.push(HEX[usize::from(b & 0xf)]);
        }
    }
    if let Some(shard) = shard {
        name.push(b'|');
        name.extend_from_slice(shard.to_string().as_bytes());
    }
    name.extend_from_slice(b"}:");
    name.extend_from_slice(rule.as_bytes());
    name
}

/// The name of the Redis key holding the block of `(rule, key)`: `<prefix>:block:{<tag>}:<rule>`,
/// in the same cluster slot as the key's counters.
pub(super) fn block_name(prefix: &str, rule: &str, key: &[u8]) -> Vec<u8> {
    key_name(&format!("{prefix}:block"), rule, key, None)
}

/// The name of the Redis key holding the override of `(rule, key)`:
/// `<prefix>:override:{<tag>}:<rule>`, in the same cluster slot as the key's counters.
pub(super) fn override_name(prefix: &str, rule: &str, key: &[u8]) -> Vec<u8> {
    key_name(&format!("{prefix}:override"), rule, key, None)
}

/// The key the circuit breaker's probes charge: `<prefix>:probe`, apart from every limit's key
/// (theirs have a hash tag right after the prefix).
pub(super) fn probe_name(prefix: &str) -> Vec<u8> {
    format!("{prefix}:probe").into_bytes()
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn is_plain(key: &[u8]) -> bool {
    !key.is_empty() && key[0] != b'=' && !key.iter().any(|b| matches!(b, b'{' | b'}' | b'|'))
}

/// Whether a prefix keeps the hash tag where it belongs (a `{` or `}` in it would move it).
pub(super) fn valid_prefix(prefix: &str) -> bool {
    !prefix.contains(['{', '}'])
}

/// The Redis Cluster slot of a key name: CRC-16/XMODEM of its hash tag (the bytes between the
/// first `{` and the next `}`, when not empty) or of the whole name, modulo 16384.
pub(super) fn slot(name: &[u8]) -> u16 {
    let hashed = name
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &name[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(name);
    crc16(hashed) & 0x3fff
}

/// CRC-16/XMODEM (polynomial 0x1021, initial value 0, no reflection), as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(rule: &str, key: &[u8], shard: Option<u32>) -> String {
        String::from_utf8(key_name("tg", rule, key, shard)).unwrap()
    }

    #[test]
    fn names_put_the_key_in_the_hash_tag() {
        assert_eq!(name("per-ip", b"10.0.0.1", None), "tg:{10.0.0.1}:per-ip");
        assert_eq!(name("global", b"", None), "tg:{=}:global");
        assert_eq!(name("r", b"a{b", None), "tg:{=617b62}:r");
        assert_eq!(name("r", b"=x", None), "tg:{=3d78}:r");
        assert_eq!(name("hot", b"", Some(3)), "tg:{=|3}:hot");
        assert_eq!(name("a:b", b"c", None), "tg:{c}:a:b");
        assert_ne!(name("a:b", b"c", None), name("a", b"b:c", None));
    }

    #[test]
    fn rules_with_the_same_key_share_a_slot_and_shards_spread() {
        let a = slot(&key_name("tg", "per-ip", b"10.0.0.1", None));
        let b = slot(&key_name("tg", "expensive", b"10.0.0.1", None));
        assert_eq!(a, b);
        assert_eq!(a, slot(&block_name("tg", "per-ip", b"10.0.0.1")));
        assert_eq!(a, slot(&override_name("tg", "per-ip", b"10.0.0.1")));
        assert_eq!(
            override_name("tg", "per-ip", b"a{b"),
            b"tg:override:{=617b62}:per-ip"
        );
        let shards: std::collections::HashSet<u16> = (0..8)
            .map(|i| slot(&key_name("tg", "global", b"", Some(i))))
            .collect();
        assert!(shards.len() > 4, "{shards:?}");
    }

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") & 0x3fff);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
    }
}

//! Redacted keys: what logs and top-offender lists show instead of a key when the layer redacts
//! keys.
//!
//! A redacted key is `#` and 16 hex digits: the first 64 bits of HMAC-SHA-256 of the key under a
//! secret. One key gives the same redaction wherever the secret is the same, so an operator can
//! still follow one key through the logs; without the secret, nobody can test guesses against
//! it. (An unkeyed hash cannot hide a key: the 2^32 IPv4 addresses are all tried in seconds, and
//! e-mail addresses or user ids from a list.)
//!
//! The secret is the layer's ([`RateLimitLayerBuilder::redact_keys_secret`], or
//! `redact_keys = { secret = "..." }` in a configuration file): instances that share it redact a
//! key alike, so one key correlates across a fleet. Without one, every process draws a random secret of its
//! own from the operating system when it first redacts, and a key correlates only within that
//! process (and is not the same after a restart).
//!
//! [`RateLimitLayerBuilder::redact_keys_secret`]: crate::RateLimitLayerBuilder::redact_keys_secret

use std::fmt;
use std::sync::OnceLock;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::algorithm::error::ConfigError;

/// The fewest bytes a shared secret may have: a short one could be guessed, and with it every
/// redaction tried against a list of keys.
pub(crate) const MIN_SECRET: usize = 16;

/// Redacts keys under one secret. Holds the HMAC state with the secret already absorbed, so a
/// redaction hashes only the key; never shows the secret (nor does its `Debug`).
#[derive(Clone)]
pub(crate) struct Redactor {
    mac: Hmac<Sha256>,
    /// Whether the secret is this process's own random one.
    per_process: bool,
}

impl Redactor {
    /// Redaction under a secret instances may share (at least [`MIN_SECRET`] bytes).
    pub(crate) fn with_secret(secret: &[u8]) -> Result<Self, ConfigError> {
        if secret.len() < MIN_SECRET {
            return Err(ConfigError::new(
                "redact_keys",
                "secret",
                format!(
                    "is {} bytes; it must have at least {MIN_SECRET} (e.g. 32 random bytes in \
                     hex: `openssl rand -hex 32`), or a short secret could be guessed",
                    secret.len()
                ),
            ));
        }
        Ok(Redactor {
            mac: Hmac::new_from_slice(secret).expect("HMAC takes a key of any length"),
            per_process: false,
        })
    }

    /// Redaction under this process's random secret, drawn from the operating system once.
    ///
    /// Without the system's random source there is no secret to hide keys with: an error (the
    /// layer is not built) rather than keys logged in a form anyone can reverse.
    pub(crate) fn per_process() -> Result<Self, ConfigError> {
        static PROCESS: OnceLock<Redactor> = OnceLock::new();
        if let Some(redactor) = PROCESS.get() {
            return Ok(redactor.clone());
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|error| {
            ConfigError::new(
                "redact_keys",
                "secret",
                format!(
                    "no random secret could be drawn ({error}): give one with \
                     `redact_keys_secret`"
                ),
            )
        })?;
        let drawn = Redactor {
            mac: Hmac::new_from_slice(&secret).expect("HMAC takes a key of any length"),
            per_process: true,
        };
        // Two layers built at once may both draw: the first stored is the process's.
        Ok(PROCESS.get_or_init(|| drawn).clone())
    }

    /// The first 64 bits of HMAC-SHA-256 of `key`.
    pub(crate) fn digest(&self, key: &[u8]) -> u64 {
        let mut mac = self.mac.clone();
        mac.update(key);
        let tag = mac.finalize().into_bytes();
        let mut first = [0u8; 8];
        first.copy_from_slice(&tag[..8]);
        u64::from_be_bytes(first)
    }

    /// `key` as logs show it: `#` and 16 hex digits.
    pub(crate) fn redact(&self, key: &[u8]) -> Redacted {
        Redacted(self.digest(key))
    }
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.per_process {
            "Redactor(per-process secret)"
        } else {
            "Redactor(shared secret)"
        })
    }
}

/// A redacted key, shown as `#` and 16 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Redacted(u64);

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::stable_key_hash;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn is_hmac_sha256_of_the_key_truncated_to_64_bits() {
        // RFC 4231, test case 2 ("Jefe"; too short for a layer's secret, so built directly).
        let redactor = Redactor {
            mac: Hmac::new_from_slice(b"Jefe").unwrap(),
            per_process: false,
        };
        assert_eq!(
            redactor.redact(b"what do ya want for nothing?").to_string(),
            "#5bdcc146bf60754e"
        );
    }

    #[test]
    fn one_secret_one_redaction_per_key() {
        let a = Redactor::with_secret(SECRET).unwrap();
        let b = Redactor::with_secret(SECRET).unwrap();
        assert_eq!(a.redact(b"203.0.113.9"), b.redact(b"203.0.113.9"));
        assert_ne!(a.redact(b"203.0.113.9"), a.redact(b"203.0.113.10"));
        assert_eq!(a.redact(b"alice").to_string().len(), 17);
    }

    #[test]
    fn another_secret_another_redaction() {
        let a = Redactor::with_secret(SECRET).unwrap();
        let b = Redactor::with_secret(b"fedcba9876543210fedcba9876543210").unwrap();
        for key in [&b"203.0.113.9"[..], b"alice@example.com", b"", b"42"] {
            assert_ne!(a.redact(key), b.redact(key), "{key:?}");
        }
    }

    #[test]
    fn the_redaction_is_no_unkeyed_hash_anyone_can_recompute() {
        // The hash logs used to show: FNV-1a of the key, which anyone can compute for every
        // IPv4 address and match against the logs.
        let unkeyed = |key: &[u8]| Redacted(stable_key_hash("", key));
        for redactor in [
            Redactor::per_process().unwrap(),
            Redactor::with_secret(SECRET).unwrap(),
        ] {
            for key in [&b"203.0.113.9"[..], b"10.0.0.1", b"alice@example.com"] {
                assert_ne!(redactor.redact(key), unkeyed(key), "{key:?}");
            }
        }
    }

    #[test]
    fn the_per_process_secret_is_random_and_kept_for_the_process() {
        let a = Redactor::per_process().unwrap();
        let b = Redactor::per_process().unwrap();
        assert_eq!(a.redact(b"10.0.0.1"), b.redact(b"10.0.0.1"));
        // Not a constant built into the crate: a secret drawn as it is drawn gives other
        // redactions.
        let mut other = [0u8; 32];
        getrandom::fill(&mut other).unwrap();
        let other = Redactor::with_secret(&other).unwrap();
        assert_ne!(a.redact(b"10.0.0.1"), other.redact(b"10.0.0.1"));
    }

    #[test]
    fn a_short_secret_is_refused() {
        let error = Redactor::with_secret(b"password").unwrap_err();
        assert_eq!(error.field(), "secret");
        assert!(error.message().contains("at least 16"), "{error}");
        assert!(Redactor::with_secret(&[7; 16]).is_ok());
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let shown = format!("{:?}", Redactor::with_secret(SECRET).unwrap());
        assert_eq!(shown, "Redactor(shared secret)");
    }
}

//! Errors reported when a layer or limiter is built.

use std::fmt;

/// A rule that cannot work, found when the layer is built: names the rule and the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    rule: String,
    field: &'static str,
    message: String,
}

impl ConfigError {
    /// An error about `field` of the rule named `rule` (for [`Store::validate`](crate::store::Store::validate)
    /// implementations).
    pub fn new(rule: &str, field: &'static str, message: impl Into<String>) -> Self {
        ConfigError {
            rule: rule.to_owned(),
            field,
            message: message.into(),
        }
    }

    /// The rule's name.
    pub fn rule(&self) -> &str {
        &self.rule
    }

    /// The offending field (`rate`, `period`, `capacity`, `cost`, …).
    pub fn field(&self) -> &str {
        self.field
    }

    /// What is wrong with it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rule {:?}: {}: {}", self.rule, self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

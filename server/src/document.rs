//! What a configuration file is read into before it is checked: the error that names the file
//! and the place, and the rules of the library's configuration that a file yields. Both forms
//! (`load` for tollgate's file, `reference` for the reference service's YAML) write into these.

use std::fmt;
use std::path::Path;

use serde_json::{json, Value};

use crate::unit::Unit;

/// A configuration that cannot be used, with the file and place that says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// A YAML error as `file:line:column: message` (the message without the place it ends with).
pub(crate) fn yaml_error(path: &Path, error: &yaml_serde::Error) -> Error {
    let message = error.to_string();
    match error.location() {
        Some(at) => {
            let suffix = format!(" at line {} column {}", at.line(), at.column());
            let message = message.strip_suffix(&suffix).unwrap_or(&message);
            Error(format!(
                "{}:{}:{}: {message}",
                path.display(),
                at.line(),
                at.column()
            ))
        }
        None => Error(format!("{}: {message}", path.display())),
    }
}

/// A rule of the library's configuration, as the library's file would write it.
#[derive(Debug)]
pub(crate) struct LibraryRule(pub(crate) Value);

impl LibraryRule {
    /// The reference's limit: a fixed window of one unit, aligned to the clock.
    pub(crate) fn fixed_window(name: &str, requests_per_unit: u32, unit: Unit) -> Self {
        LibraryRule(json!({
            "name": name,
            "algorithm": "fixed_window",
            "limit": requests_per_unit,
            "period": format!("{}s", unit.duration().as_secs()),
            "aligned": true,
        }))
    }
}

//! What a configuration file is read into before it is checked: the error that names the file
//! and the place, and the library's rules that a file yields. Both forms (`load` for tollgate's
//! file, `reference` for the reference service's YAML) write into these.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;

use tollgate::config::ConfigFormat;
use tollgate::{Limit, Rule};

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

/// An error of the server's own checks of the file at `path`, whose `message` begins with the
/// place it is about (`rules[1] (rule "api").descriptors: …`, `descriptors[0].rate_limit: …`):
/// the place's line and column in the file's `text` follow the file's name, as the parser's own
/// errors and the library's name them. A place the text does not hold (a missing field) is
/// located at the deepest part it does hold.
pub(crate) fn placed_error(path: &Path, format: ConfigFormat, text: &str, message: &str) -> Error {
    // The place is the message's first part, without the rule's name the server puts in it.
    let without_rule = match message.find(" (rule \"") {
        Some(start) => match message[start..].find("\")") {
            Some(end) => format!("{}{}", &message[..start], &message[start + end + 2..]),
            None => message.to_owned(),
        },
        None => message.to_owned(),
    };
    let place = without_rule.split(": ").next().unwrap_or_default();
    match tollgate::config::locate(format, text, place) {
        Some((line, column)) => Error(format!("{}:{line}:{column}: {message}", path.display())),
        None => Error(format!("{}: {message}", path.display())),
    }
}

/// The library's rules that a configuration yields, and every rule name taken so far: two
/// limits never share a counter because their names look alike.
#[derive(Debug, Default)]
pub(crate) struct LibraryRules {
    pub(crate) list: Vec<Rule>,
    names: HashSet<String>,
}

impl LibraryRules {
    /// Takes `name` for a rule written in tollgate's own file (its author chose it).
    pub(crate) fn reserve(&mut self, name: &str) {
        self.names.insert(name.to_owned());
    }

    /// `wanted`, or, when a rule already has that name, `wanted#2` (`#3`, …): the first free
    /// one in the order the configuration is read. A reference file's level names can meet
    /// (`x: "y.z"` and `x: "y"` then `z` both read `x_y.z`), and each level is a counter of
    /// its own, as in the reference.
    pub(crate) fn unique_name(&mut self, wanted: String) -> String {
        let mut name = wanted.clone();
        let mut n = 1;
        while self.names.contains(&name) {
            n += 1;
            name = format!("{wanted}#{n}");
        }
        self.names.insert(name.clone());
        name
    }
}

/// The reference's limit: a fixed window of one unit, aligned to the clock (windows start at
/// multiples of the unit since the Unix epoch).
pub(crate) fn fixed_window(name: &str, requests_per_unit: u32, unit: Unit) -> Rule {
    let limit = Limit::fixed_window(u64::from(requests_per_unit), unit.duration()).aligned();
    Rule::new(name, limit)
}

//! `ConfigFileError`: what is wrong with a configuration file, and where.

use std::fmt;
use std::path::{Path, PathBuf};

/// A configuration that cannot be loaded: unreadable, not valid TOML or YAML, or a value that
/// cannot work. Names the file, the place in it, and — when the parser knows it — the line and
/// column.
///
/// Displayed as `FILE:LINE:COLUMN: PLACE: MESSAGE`, for example
/// `api.toml:14:10: rules[2].period: invalid duration "1 fortnight" (expected e.g. "500ms", ...)`
/// or `api.toml:12:8: rules[2].rate (rule "login"): must be greater than 0`. The place is
/// written as in the file (`rules[2]` is the third `[[rules]]` entry;
/// `rules[0].tiers.plans.pro.rate`). Values checked after parsing (every value that depends on
/// another) carry the name of their rule too, once the file has been read far enough to know
/// it; a value that is missing is located at the table that lacks it. A configuration given as
/// a string has no file: `line 14, column 10: rules[2].period: ...`.
#[derive(Debug)]
pub struct ConfigFileError {
    file: Option<PathBuf>,
    path: String,
    /// Boxed: the error stays small enough to return by value.
    rule: Option<Box<str>>,
    location: Option<(usize, usize)>,
    message: String,
    source: Option<std::io::Error>,
}

impl ConfigFileError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigFileError {
            file: None,
            path: path.into(),
            rule: None,
            location: None,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn io(file: &Path, error: std::io::Error) -> Self {
        ConfigFileError {
            message: format!("cannot read the file: {error}"),
            source: Some(error),
            ..ConfigFileError::new("", "").in_file(file)
        }
    }

    pub(crate) fn at_line(mut self, line: usize, column: usize) -> Self {
        self.location = Some((line, column));
        self
    }

    pub(crate) fn of_rule(mut self, name: impl Into<String>) -> Self {
        self.rule = Some(name.into().into_boxed_str());
        self
    }

    pub(crate) fn in_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_owned());
        self
    }

    /// The file, when the configuration came from one.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The place of the bad value, written as in the file (`rules[2].rate`, `store.url`); empty
    /// when the error is about the whole file (unreadable, not valid TOML).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The name of the rule the bad value belongs to, when it is in a rule whose name the file
    /// gives (`rules[2]` is easier to find by its name).
    pub fn rule(&self) -> Option<&str> {
        self.rule.as_deref()
    }

    /// The line of the error (1-based), when the parser reports it.
    pub fn line(&self) -> Option<usize> {
        self.location.map(|(line, _)| line)
    }

    /// The column of the error (1-based, in characters), when the parser reports it.
    pub fn column(&self) -> Option<usize> {
        self.location.map(|(_, column)| column)
    }

    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.location) {
            (Some(file), Some((line, column))) => {
                write!(f, "{}:{line}:{column}: ", file.display())?
            }
            (Some(file), None) => write!(f, "{}: ", file.display())?,
            (None, Some((line, column))) => write!(f, "line {line}, column {column}: ")?,
            (None, None) => {}
        }
        match (&self.rule, self.path.is_empty()) {
            (Some(rule), false) => write!(f, "{} (rule {rule:?}): ", self.path)?,
            (None, false) => write!(f, "{}: ", self.path)?,
            (_, true) => {}
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The line and column (1-based) of byte `offset` in `text`.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// serde's messages, said in the file's terms: the unknown or missing field goes into the place,
/// Rust type names become what to write.
pub(crate) fn refine(path: &str, message: &str) -> (String, String) {
    let path = if path == "." { "" } else { path };
    // serde_path_to_error's path already ends with an unknown field, not with a missing one.
    let join = |field: &str| {
        if path.is_empty() || path == field {
            field.to_owned()
        } else if path.ends_with(&format!(".{field}")) {
            path.to_owned()
        } else {
            format!("{path}.{field}")
        }
    };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        if let Some((field, expected)) = rest.split_once('`') {
            let expected = expected.trim_start_matches(", ");
            let message = if expected.starts_with("there are no fields") {
                "unknown field (this table takes none)".to_owned()
            } else {
                format!("unknown field ({expected})")
            };
            return (join(field), message);
        }
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        if let Some((field, _)) = rest.split_once('`') {
            return (join(field), "is required".to_owned());
        }
    }
    if let Some(rest) = message.strip_prefix("duplicate field `") {
        if let Some((field, _)) = rest.split_once('`') {
            return (join(field), "is given twice".to_owned());
        }
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        if let Some((value, expected)) = rest.split_once('`') {
            let expected = expected.trim_start_matches(", ");
            return (
                path.to_owned(),
                format!("unknown value {value:?} ({expected})"),
            );
        }
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            if let Some((found, expected)) = rest.rsplit_once(", expected ") {
                return (
                    path.to_owned(),
                    format!("expected {}, found {found}", plain_type(expected)),
                );
            }
        }
    }
    (path.to_owned(), message.to_owned())
}

fn plain_type(expected: &str) -> &str {
    match expected {
        "u8" => "a whole number from 0 to 255",
        "u16" => "a whole number from 0 to 65535",
        "u32" | "u64" | "usize" => "a whole number (0 or more)",
        "a sequence" => "a list",
        "a map" => "a table",
        "a boolean" => "true or false",
        other if other.starts_with("struct ") => "a table",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_columns_are_one_based() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 6), (2, 1));
        assert_eq!(line_column(text, text.find('"').unwrap()), (2, 6));
        assert_eq!(line_column(text, 1_000), (3, 1));
    }

    #[test]
    fn serde_messages_are_refined() {
        assert_eq!(
            refine(
                "rules[0].rat",
                "unknown field `rat`, expected one of `rate`, `limit`"
            ),
            (
                "rules[0].rat".into(),
                "unknown field (expected one of `rate`, `limit`)".into()
            )
        );
        assert_eq!(
            refine(".", "missing field `rules`"),
            ("rules".into(), "is required".into())
        );
        assert_eq!(
            refine("rules[1].rate", "invalid type: string \"10\", expected u64"),
            (
                "rules[1].rate".into(),
                "expected a whole number (0 or more), found string \"10\"".into()
            )
        );
        assert_eq!(
            refine("x", "something else"),
            ("x".into(), "something else".into())
        );
    }
}

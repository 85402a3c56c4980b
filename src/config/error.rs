//! `ConfigFileError`: what is wrong with a configuration file, and where.

use std::fmt;
use std::path::{Path, PathBuf};

/// A configuration that cannot be loaded: unreadable, not valid TOML or YAML, or a value that
/// cannot work. Names the file, the place in it, and — when the parser knows it — the line and
/// column.
///
/// Displayed as `FILE:LINE:COLUMN: PLACE: MESSAGE`, for example
/// `api.toml:14:10: rules[2].period (rule "login"): invalid duration "1 fortnight" (expected e.g.
/// "500ms", ...)` or `api.toml:3:8: store.max_keys: must be greater than 0`. The place is
/// written as in the file (`rules[2]` is the third `[[rules]]` entry;
/// `rules[0].tiers.plans.pro.rate`), followed by the rule's name when the file gives one. A
/// misspelt field or value names the one it is likely a misspelling of
/// (``rules[1].rat (rule "api"): unknown field (did you mean `rate`?)``); a value that is missing
/// is located at the table that lacks it; a tab in a YAML file's indentation is located at the
/// tab. A configuration given as a string has no file: `line 14, column 10: rules[2].period
/// (rule "login"): ...`.
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
    /// gives (`rules[2]` is easier to find by its name), even when the file does not parse.
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
/// a misspelt field or value gets the closest right one, Rust type names become what to write.
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
            let names = quoted_names(expected);
            let message = if expected.starts_with("there are no fields") {
                "unknown field (this table takes none)".to_owned()
            } else if let Some(new) = renamed(field, &names) {
                format!("unknown field (did you mean `{new}`? `{field}` was its name before 0.3)")
            } else if let Some(near) = closest(field, &names) {
                format!("unknown field (did you mean `{near}`?)")
            } else if names.len() > LISTED_NAMES {
                format!(
                    "unknown field (none of this table's {} fields is spelled like it; the \
                     configuration reference lists them)",
                    names.len()
                )
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
            let message = match closest(value, &quoted_names(expected)) {
                Some(near) => format!("unknown value {value:?} (did you mean {near:?}?)"),
                None => format!("unknown value {value:?} ({expected})"),
            };
            return (path.to_owned(), message);
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

/// The most names an error lists; a table with more is not listed (its fields are in the
/// configuration reference), only the closest name suggested.
const LISTED_NAMES: usize = 8;

/// The names between backticks in serde's "expected one of `a`, `b`".
fn quoted_names(expected: &str) -> Vec<&str> {
    expected.split('`').skip(1).step_by(2).collect()
}

/// The name among `names` that `word` is most likely a misspelling of: the nearest by edit
/// distance (a swap of two neighbours counting as one edit, case ignored), if it is near
/// enough — at most one edit for a word of up to five characters, then one more per three
/// characters, and fewer edits than either has characters. Ties go to the earlier name.
/// Fields renamed in a release, old name first: a file that still says the old one is pointed at
/// the new, which no edit distance would find (`burst` is now only a queue's word).
const RENAMED: &[(&str, &str)] = &[("burst", "capacity")];

/// The new name of `field` when it is an old one and the table takes the new one.
fn renamed<'a>(field: &str, names: &[&'a str]) -> Option<&'a str> {
    let (_, new) = RENAMED.iter().find(|(old, _)| *old == field)?;
    names.iter().copied().find(|name| name == new)
}

pub(crate) fn closest<'a>(word: &str, names: &[&'a str]) -> Option<&'a str> {
    let word: Vec<char> = word.to_lowercase().chars().collect();
    let most = (word.len() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for &name in names {
        let candidate: Vec<char> = name.to_lowercase().chars().collect();
        let edits = distance(&word, &candidate);
        if edits <= most
            && edits < word.len().min(candidate.len())
            && best.is_none_or(|(b, _)| edits < b)
        {
            best = Some((edits, name));
        }
    }
    best.map(|(_, name)| name)
}

/// The optimal string alignment distance: insertions, deletions, substitutions and swaps of
/// two neighbouring characters, each one edit.
fn distance(a: &[char], b: &[char]) -> usize {
    // Three rows of the table: two back (for swaps), the last, and the one being filled.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    let mut row = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let substitution = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (last[j] + 1)
                .min(row[j - 1] + 1)
                .min(last[j - 1] + substitution);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(before[j - 2] + 1);
            }
        }
        std::mem::swap(&mut before, &mut last);
        std::mem::swap(&mut last, &mut row);
    }
    last[b.len()]
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
    fn misspellings_get_the_nearest_name_when_it_is_near() {
        let fields = [
            "name",
            "rate",
            "limit",
            "period",
            "capacity",
            "on_missing_key",
        ];
        assert_eq!(closest("rat", &fields), Some("rate"));
        assert_eq!(closest("Rate", &fields), Some("rate"));
        // A swap of two neighbours is one edit.
        assert_eq!(closest("perido", &fields), Some("period"));
        assert_eq!(closest("capactiy", &fields), Some("capacity"));
        assert_eq!(closest("on_mising_kee", &fields), Some("on_missing_key"));
        // Too far: two edits in a word of five or fewer characters; anything unrelated.
        assert_eq!(closest("lmt", &fields), None);
        assert_eq!(closest("colour", &fields), None);
        assert_eq!(closest("x", &["y", "xy"]), None);
        assert_eq!(
            closest("leaky_bucket", &["token_bucket", "fixed_window"]),
            None
        );
        // Ties go to the earlier name.
        assert_eq!(closest("bat", &["cat", "hat"]), Some("cat"));
    }

    #[test]
    fn edit_distances() {
        let d = |a: &str, b: &str| {
            distance(
                &a.chars().collect::<Vec<_>>(),
                &b.chars().collect::<Vec<_>>(),
            )
        };
        assert_eq!(d("", ""), 0);
        assert_eq!(d("abc", ""), 3);
        assert_eq!(d("", "abc"), 3);
        assert_eq!(d("kitten", "sitting"), 3);
        assert_eq!(d("ab", "ba"), 1);
        assert_eq!(d("défaut", "default"), 2);
        assert_eq!(d("rate", "rate"), 0);
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
                "unknown field (did you mean `rate`?)".into()
            )
        );
        assert_eq!(
            refine(
                "rules[0].colour",
                "unknown field `colour`, expected one of `rate`, `limit`"
            ),
            (
                "rules[0].colour".into(),
                "unknown field (expected one of `rate`, `limit`)".into()
            )
        );
        let many = "unknown field `colour`, expected one of `a1`, `a2`, `a3`, `a4`, `a5`, `a6`, `a7`, `a8`, `a9`";
        assert_eq!(
            refine("rules[0].colour", many).1,
            "unknown field (none of this table's 9 fields is spelled like it; the configuration \
             reference lists them)"
        );
        assert_eq!(
            refine(
                "rules[0].algorithm",
                "unknown variant `slidingwindow`, expected `fixed_window` or `sliding_window`"
            ),
            (
                "rules[0].algorithm".into(),
                "unknown value \"slidingwindow\" (did you mean \"sliding_window\"?)".into()
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

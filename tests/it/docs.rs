//! The commands the docs tell people to run name targets that exist: every `cargo … --test`,
//! `--example`, `--bench`, `--bin NAME` and `-p NAME` written in the README, the guide's chapters
//! (`src/guide/*.md`), the docs, the benchmarks page and its notes, the scripts and the code's
//! comments. (The CHANGELOG is history: a command
//! it quotes may name what a later version renamed.) And rustdoc cites no design section of a
//! file that is not in the repository.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The workspace's packages, each with its targets as (kind, name).
fn targets(root: &Path) -> HashMap<String, HashSet<(String, String)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            let targets = package["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let kind = t["kind"][0].as_str().unwrap().to_owned();
                    (kind, t["name"].as_str().unwrap().to_owned())
                })
                .collect();
            (package["name"].as_str().unwrap().to_owned(), targets)
        })
        .collect()
}

/// The files whose commands are checked.
fn documented_files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" {
                    walk(&path, files);
                }
            } else if [".rs", ".md", ".sh", ".toml"]
                .iter()
                .any(|e| name.ends_with(e))
                && name != "CHANGELOG.md"
            {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for top in [
        "src", "cli", "server", "bench", "tests", "examples", "scripts", "docs",
    ] {
        walk(&root.join(top), &mut files);
    }
    for file in [
        "README.md",
        "BENCHMARKS.md",
        "ARCHITECTURE.md",
        "Cargo.toml",
    ] {
        files.push(root.join(file));
    }
    files
}

fn is_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The targets a line's `cargo` commands name that do not exist.
fn unknown_targets(
    line: &str,
    packages: &HashMap<String, HashSet<(String, String)>>,
) -> Vec<String> {
    let mut unknown = Vec::new();
    for (at, _) in line.match_indices("cargo ") {
        let words: Vec<&str> = line[at + "cargo ".len()..]
            .split_whitespace()
            .map(|w| w.trim_matches(|c| "`\"'),.;".contains(c)))
            .collect();
        let command = words.first().copied().unwrap_or_default();
        if ![
            "run", "test", "bench", "build", "clippy", "check", "doc", "tree", "install",
        ]
        .contains(&command)
        {
            continue;
        }
        let package = words
            .windows(2)
            .find(|w| w[0] == "-p" || w[0] == "--package")
            .map(|w| w[1]);
        if let Some(package) = package.filter(|p| is_name(p)) {
            if !packages.contains_key(package) {
                unknown.push(format!("-p {package}"));
                continue;
            }
        }
        let pool = &packages[package.filter(|p| is_name(p)).unwrap_or("tollgate")];
        for pair in words.windows(2) {
            let kind = match pair[0] {
                "--test" => "test",
                "--example" => "example",
                "--bench" => "bench",
                "--bin" => "bin",
                _ => continue,
            };
            // A flag named in prose (`no --bench argument`) is not a command's.
            let prose = ["argument", "flag", "option"].contains(&pair[1]);
            if is_name(pair[1]) && !prose && !pool.contains(&(kind.to_owned(), pair[1].to_owned()))
            {
                unknown.push(format!("{} {}", pair[0], pair[1]));
            }
        }
    }
    unknown
}

#[test]
fn every_command_in_the_docs_names_a_real_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let packages = targets(root);
    assert!(packages.contains_key("tollgate-server") && packages.contains_key("quickstart"));
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in documented_files(root) {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        // This file's own examples name missing targets on purpose.
        if file.ends_with("tests/it/docs.rs") {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            checked += line.matches("cargo ").count();
            for target in unknown_targets(line, &packages) {
                let place = file.strip_prefix(root).unwrap_or(&file).display();
                wrong.push(format!("{place}:{}: {target}", n + 1));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} commands read: the files moved?"
    );
    assert!(
        wrong.is_empty(),
        "commands naming no target:\n{}",
        wrong.join("\n")
    );
}

/// The guide's chapters, shown on docs.rs, are read by both checks: each `src/guide/*.md` is
/// among the files whose commands are checked, and as a page of `src/` its text is rustdoc.
#[test]
fn the_guides_chapters_are_checked() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = documented_files(root);
    let chapters: Vec<PathBuf> = std::fs::read_dir(root.join("src/guide"))
        .expect("the guide")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    assert!(chapters.len() >= 12, "{chapters:?}");
    for chapter in &chapters {
        assert!(
            files.contains(chapter),
            "{} is not checked",
            chapter.display()
        );
    }
    let notes = root.join("bench/NOTES.md");
    assert!(!notes.exists() || files.contains(&notes));
}

#[test]
fn the_check_itself_finds_a_target_that_is_not_there() {
    let packages = targets(Path::new(env!("CARGO_MANIFEST_DIR")));
    // The missing targets are put together here, so that no command in this file names one.
    let (test, example) = (
        ["--test", "soak"].join(" "),
        ["--example", "nothing"].join(" "),
    );
    assert_eq!(
        unknown_targets(
            &format!("run `cargo test --release {test} -- --ignored`"),
            &packages
        ),
        [test]
    );
    assert_eq!(
        unknown_targets(
            &format!("cargo run -p tollgate-server {example}"),
            &packages
        ),
        [example]
    );
    assert_eq!(
        unknown_targets("cargo build -p nope", &packages),
        ["-p nope"]
    );
    assert!(unknown_targets("cargo test -p tollgate-cli --test cli", &packages).is_empty());
}

#[test]
fn rustdoc_cites_no_design_section() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cited = Vec::new();
    // What docs.rs shows: the published crates' sources (tests and benches are not rustdoc
    // anyone reads).
    let published = ["src", "cli/src", "server/src"].map(|dir| root.join(dir));
    for file in documented_files(root) {
        if !published.iter().any(|dir| file.starts_with(dir)) {
            continue;
        }
        let in_rustdoc = |line: &str| {
            let line = line.trim_start();
            line.starts_with("///") || line.starts_with("//!")
        };
        let is_doc_page =
            file.extension().is_some_and(|e| e == "md") && file.starts_with(root.join("src"));
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if line.contains("DESIGN §") && (is_doc_page || in_rustdoc(line)) {
                let place = file.strip_prefix(root).unwrap_or(&file).display();
                cited.push(format!("{place}:{}", n + 1));
            }
        }
    }
    assert!(
        cited.is_empty(),
        "rustdoc citing DESIGN:\n{}",
        cited.join("\n")
    );
}

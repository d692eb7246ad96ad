//! The documentation cannot drift: every relative link in README.md and docs/ reaches an
//! existing file and heading, and docs/configuration.md lists exactly the flags `--help`
//! has, each with its environment variable and default.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use outbox_relay::config::Cli;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every page under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let docs = std::fs::read_dir(root().join("docs")).unwrap();
    let mut docs: Vec<PathBuf> = docs
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.insert(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// The targets of the inline links `[text](target)` in `text`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            let target = &rest[..end];
            if !target.contains(char::is_whitespace) {
                targets.push(target.to_owned());
            }
        }
    }
    targets
}

#[test]
fn every_relative_link_in_the_docs_reaches_a_file_and_a_heading() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let file = match path {
                "" => page.clone(),
                path => page.parent().unwrap().join(path),
            };
            let name = page.strip_prefix(root()).unwrap().display().to_string();
            if !file.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
            } else if !fragment.is_empty()
                && file.extension().is_some_and(|ext| ext == "md")
                && !anchors(&file).contains(fragment)
            {
                broken.push(format!("{name}: {target} (no such heading)"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The rows of docs/configuration.md's tables that name a flag, by flag.
fn documented_flags() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let mut rows = BTreeMap::new();
    for line in text.lines().filter(|line| line.starts_with("| `-")) {
        let first_cell = line.split('|').nth(1).unwrap_or_default();
        for flag in first_cell.split('`').filter(|part| part.starts_with("--")) {
            rows.insert(flag.to_owned(), line.to_owned());
        }
    }
    rows
}

#[test]
fn the_configuration_reference_matches_the_help() {
    let command = Cli::command();
    let documented = documented_flags();
    let mut problems = Vec::new();
    let mut in_help = BTreeSet::new();
    for arg in command.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if arg.is_hide_set() || ["help", "version"].contains(&long) {
            continue;
        }
        let flag = format!("--{long}");
        in_help.insert(flag.clone());
        let Some(row) = documented.get(&flag) else {
            problems.push(format!(
                "{flag} is in --help but not in docs/configuration.md"
            ));
            continue;
        };
        if let Some(env) = arg.get_env() {
            let env = format!("`{}`", env.to_string_lossy());
            if !row.contains(&env) {
                problems.push(format!("{flag}: its row does not name {env}"));
            }
        }
        for default in arg.get_default_values() {
            let default = format!("`{}`", default.to_string_lossy());
            if !row.contains(&default) {
                problems.push(format!(
                    "{flag}: its row does not give the default {default}"
                ));
            }
        }
    }
    for flag in documented.keys() {
        if !in_help.contains(flag) {
            problems.push(format!(
                "{flag} is in docs/configuration.md but not in --help"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_subcommand_and_its_own_flags_are_in_the_configuration_reference() {
    let text = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let mut problems = Vec::new();
    for sub in Cli::command().get_subcommands() {
        let name = format!("| `outbox-relay {}`", sub.get_name());
        let Some(row) = text.lines().find(|line| line.starts_with(&name)) else {
            problems.push(format!("{name} has no row in the Subcommands table"));
            continue;
        };
        for arg in sub.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if arg.is_hide_set() || arg.is_global_set() || long == "help" {
                continue;
            }
            if !row.contains(&format!("`--{long}")) {
                problems.push(format!("outbox-relay {}: --{long} missing", sub.get_name()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

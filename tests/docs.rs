//! The documentation cannot drift: every relative link in README.md and docs/ reaches an
//! existing file and heading, and docs/configuration.md lists exactly the flags `--help`
//! has, each with its environment variable and default, in the groups `--help` shows.

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

/// A flag's row in docs/configuration.md, and the group (the bold line above its table) it
/// is in.
struct Documented {
    row: String,
    group: String,
}

/// The rows of docs/configuration.md's tables that name a flag, by flag.
fn documented_flags() -> BTreeMap<String, Documented> {
    let text = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let mut rows = BTreeMap::new();
    let mut group = String::new();
    for line in text.lines() {
        if let Some(bold) = line.strip_prefix("**") {
            group = bold.split("**").next().unwrap_or_default().to_owned();
        }
        if !line.starts_with("| `-") {
            continue;
        }
        let first_cell = line.split('|').nth(1).unwrap_or_default();
        for flag in first_cell.split('`').filter(|part| part.starts_with("--")) {
            let row = line.to_owned();
            let group = group.clone();
            rows.insert(flag.to_owned(), Documented { row, group });
        }
    }
    rows
}

/// The flags `--help` lists (hidden ones, `--help` and `--version` aside), in its order.
fn help_flags(command: &clap::Command) -> Vec<&clap::Arg> {
    let listed = |arg: &&clap::Arg| {
        let long = arg.get_long().unwrap_or("help");
        !arg.is_hide_set() && !["help", "version"].contains(&long)
    };
    command.get_arguments().filter(listed).collect()
}

#[test]
fn the_configuration_reference_matches_the_help() {
    let command = Cli::command();
    let documented = documented_flags();
    let mut problems = Vec::new();
    let mut in_help = BTreeSet::new();
    for arg in help_flags(&command) {
        let Some(long) = arg.get_long() else { continue };
        let flag = format!("--{long}");
        in_help.insert(flag.clone());
        let Some(Documented { row, .. }) = documented.get(&flag) else {
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
fn the_help_groups_the_flags_as_the_configuration_reference_does() {
    let command = Cli::command();
    let documented = documented_flags();
    let mut problems = Vec::new();
    let mut help_groups: Vec<&str> = Vec::new();
    for arg in help_flags(&command) {
        let Some(long) = arg.get_long() else { continue };
        let heading = arg.get_help_heading().unwrap_or("Options");
        if !help_groups.contains(&heading) {
            help_groups.push(heading);
        }
        let Some(Documented { group, .. }) = documented.get(&format!("--{long}")) else {
            continue; // the_configuration_reference_matches_the_help says so
        };
        if group != heading {
            problems.push(format!(
                "--{long}: --help groups it under {heading:?}, docs/configuration.md under {group:?}"
            ));
        }
    }
    let mut doc_groups: Vec<&str> = Vec::new();
    for Documented { group, .. } in documented.values() {
        if !doc_groups.contains(&group.as_str()) {
            doc_groups.push(group);
        }
    }
    let text = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    doc_groups.sort_by_key(|group| text.find(&format!("**{group}**")));
    if problems.is_empty() && help_groups != doc_groups {
        problems.push(format!(
            "--help's groups {help_groups:?} are not docs/configuration.md's {doc_groups:?}"
        ));
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

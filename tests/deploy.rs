//! The deployment files: `deploy/` and `docker-compose.yml`.
//!
//! Docker and Kubernetes are not needed to run these: the files are parsed and
//! checked against the relay itself. Environment variables and flags must be the
//! binary's own (read from its `--help`, where clap prints `[env: NAME=]` for each),
//! metric names in PromQL must be in [`metrics::ALL`], and the properties a
//! correct deployment depends on (one replica with `Recreate`, the probes, a
//! non-root image with a health check, the alert rules being the same in both
//! formats) are asserted. Every check is a function returning its findings, so
//! `checks_catch_mistakes` can show each one failing on a broken input.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use outbox_relay::observability::metrics;
use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::{Value, json};
use yaml_rust2::{Yaml, YamlLoader};

use crate::support::http::get;
use crate::support::relay::{Relay, binary};
use crate::support::world::World;

// --- reading the files -------------------------------------------------------------------

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `deploy/`, sorted, as paths relative to the repository root.
fn deploy_files() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(&root().join("deploy"), &mut paths);
    let mut files: Vec<String> = paths
        .iter()
        .map(|p| {
            p.strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    files.sort();
    files
}

/// `docker-compose.yml` and every `*.yml`/`*.yaml` under `deploy/`.
fn yaml_files() -> Vec<String> {
    let mut files: Vec<String> = deploy_files()
        .into_iter()
        .filter(|f| f.ends_with(".yml") || f.ends_with(".yaml"))
        .collect();
    files.push("docker-compose.yml".to_owned());
    files
}

/// The documents of a YAML file, as JSON values (easier to walk).
fn parse_yaml(text: &str) -> Result<Vec<Value>, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    docs.iter().map(yaml_to_json).collect()
}

fn yaml_to_json(yaml: &Yaml) -> Result<Value, String> {
    Ok(match yaml {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => json!(i),
        Yaml::Real(r) => json!(r.parse::<f64>().map_err(|_| format!("not a number: {r}"))?),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(items) => {
            Value::Array(items.iter().map(yaml_to_json).collect::<Result<_, _>>()?)
        }
        Yaml::Hash(map) => {
            let mut object = serde_json::Map::new();
            for (k, v) in map {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => return Err(format!("unsupported mapping key {other:?}")),
                };
                object.insert(key, yaml_to_json(v)?);
            }
            Value::Object(object)
        }
        Yaml::Alias(_) | Yaml::BadValue => return Err(format!("unsupported YAML node {yaml:?}")),
    })
}

fn load_yaml(relative: &str) -> Vec<Value> {
    parse_yaml(&read(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// The single document of `relative` whose `kind` is `kind`.
fn manifest(relative: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = load_yaml(relative)
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "{relative}: one {kind} expected");
    found.remove(0)
}

fn str_of<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

// --- what the binary accepts ---------------------------------------------------------------

/// The relay's flags and environment variables, from `--help` of the binary and
/// of each subcommand.
struct Cli {
    /// Flags of the relay itself (`outbox-relay --help`), long and short.
    relay_flags: BTreeSet<String>,
    /// Flags of any command.
    any_flags: BTreeSet<String>,
    env_vars: BTreeSet<String>,
}

fn help(args: &[&str]) -> String {
    let output = Command::new(binary())
        .args(args)
        .arg("--help")
        .env_clear()
        .output()
        .expect("run outbox-relay --help");
    assert!(output.status.success(), "{args:?} --help failed");
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

/// `--flag` and `-X` at the start of the option lines of a clap help text.
fn help_flags(help: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for line in help.lines() {
        for word in line.split_whitespace() {
            let word = word.trim_end_matches(',');
            if !word.starts_with('-') {
                break;
            }
            flags.insert(word.to_owned());
        }
    }
    flags
}

/// The `OUTBOX_RELAY_*` names in `[env: NAME=...]` (or `[env: NAME]` when hidden).
fn help_env_vars(help: &str) -> BTreeSet<String> {
    help.split("[env: ")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect()
        })
        .collect()
}

/// Subcommand names from the `Commands:` section.
fn help_subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

fn cli() -> &'static Cli {
    static CLI: OnceLock<Cli> = OnceLock::new();
    CLI.get_or_init(|| {
        let top = help(&[]);
        let relay_flags = help_flags(&top);
        let mut any_flags = relay_flags.clone();
        let mut env_vars = help_env_vars(&top);
        let subcommands = help_subcommands(&top);
        assert!(
            subcommands.contains(&"status".to_owned()),
            "{subcommands:?}"
        );
        for sub in &subcommands {
            let text = help(&[sub]);
            any_flags.extend(help_flags(&text));
            env_vars.extend(help_env_vars(&text));
        }
        assert!(relay_flags.contains("--http-addr") && relay_flags.contains("-X"));
        assert!(env_vars.contains("OUTBOX_RELAY_HTTP_ADDR"), "{env_vars:?}");
        assert!(
            env_vars.contains("OUTBOX_RELAY_POSTGRES_URL"),
            "hidden value: {env_vars:?}"
        );
        Cli {
            relay_flags,
            any_flags,
            env_vars,
        }
    })
}

// --- the checks: each returns what is wrong ---------------------------------------------------

/// `OUTBOX_RELAY_*` names in `text`; a bare prefix (`OUTBOX_RELAY_<NAME>`) is not a name.
fn env_vars_in(text: &str) -> BTreeSet<String> {
    text.split("OUTBOX_RELAY_")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .filter(|suffix| !suffix.is_empty())
        .map(|suffix| format!("OUTBOX_RELAY_{suffix}"))
        .collect()
}

fn unknown_env_vars(file: &str, text: &str, known: &BTreeSet<String>) -> Vec<String> {
    env_vars_in(text)
        .into_iter()
        .filter(|v| !known.contains(v))
        .map(|v| format!("{file}: {v} is not an environment variable of outbox-relay"))
        .collect()
}

/// `--flag` words in prose (runbooks, descriptions), `=value` and punctuation cut off.
fn flags_in_prose(text: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || "`'\"(),;".contains(c))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.split('=')
                .next()
                .unwrap_or(w)
                .trim_end_matches(['.', ':'])
                .to_owned()
        })
        .collect()
}

/// Flags in an argument list (`--flag value`, `--flag=value`, `-X value`) that `known` lacks.
fn unknown_flags(context: &str, args: &[String], known: &BTreeSet<String>) -> Vec<String> {
    args.iter()
        .filter(|a| a.starts_with('-'))
        .map(|a| a.split('=').next().unwrap_or(a))
        .filter(|flag| !known.contains(*flag))
        .map(|flag| format!("{context}: {flag} is not a flag of outbox-relay"))
        .collect()
}

/// Histograms: their `_bucket`, `_sum` and `_count` series are theirs too.
const HISTOGRAMS: &[&str] = &[metrics::COMMIT_TO_ACK_SECONDS];

/// Metric names an expression selects.
fn selected_metrics(expr: &str) -> Result<BTreeSet<String>, String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = ();
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, ()> {
            let selector = match expr {
                Expr::VectorSelector(vs) => Some(vs),
                Expr::MatrixSelector(ms) => Some(&ms.vs),
                _ => None,
            };
            if let Some(name) = selector.and_then(|vs| vs.name.clone()) {
                self.0.insert(name);
            }
            Ok(true)
        }
    }
    let ast = parser::parse(expr).map_err(|e| format!("{expr:?} does not parse: {e}"))?;
    let mut names = Names(BTreeSet::new());
    let _ = walk_expr(&mut names, &ast);
    Ok(names.0)
}

/// Unknown metrics (and parse errors) of PromQL expressions. `up` is Prometheus' own.
fn unknown_metrics(context: &str, exprs: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for expr in exprs {
        let names = match selected_metrics(expr) {
            Ok(names) => names,
            Err(e) => {
                problems.push(format!("{context}: {e}"));
                continue;
            }
        };
        for name in names {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| HISTOGRAMS.contains(base))
                .unwrap_or(&name);
            if base != "up" && !metrics::ALL.contains(&base) {
                problems.push(format!(
                    "{context}: {name} in {expr:?} is not a metric of outbox-relay (metrics::ALL)"
                ));
            }
        }
    }
    problems
}

/// Grafana's variables, replaced so the expression is plain PromQL.
fn grafana_to_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
        .replace("$instance", ".*")
}

/// Every PromQL expression of the dashboard: panel targets and query variables
/// (`label_values(METRIC, label)` becomes `METRIC`).
fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(grafana_to_promql(target["expr"].as_str().unwrap_or("")));
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] == "query" {
            let query = var["query"]["query"].as_str().unwrap_or("");
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|q| q.split(',').next())
                .unwrap_or(query);
            exprs.push(grafana_to_promql(inner));
        }
    }
    exprs
}

fn dashboard_problems(dashboard: &Value) -> Vec<String> {
    let mut problems = unknown_metrics("dashboard", &dashboard_exprs(dashboard));
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    let mut ids = BTreeSet::new();
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or("?");
        if !ids.insert(panel["id"].to_string()) {
            problems.push(format!("dashboard: panel id {} repeats", panel["id"]));
        }
        if panel["type"] == "row" {
            continue;
        }
        if panel["datasource"]["uid"] != "${datasource}" {
            problems.push(format!(
                "dashboard: panel {title:?} does not use ${{datasource}}"
            ));
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("dashboard: panel {title:?} has no query"));
        }
        for flag in flags_in_prose(panel["description"].as_str().unwrap_or("")) {
            if !cli().any_flags.contains(&flag) {
                problems.push(format!(
                    "dashboard: panel {title:?} names unknown flag {flag}"
                ));
            }
        }
    }
    let has_datasource_variable = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| v["name"] == "datasource" && v["type"] == "datasource");
    if !has_datasource_variable {
        problems.push("dashboard: no `datasource` variable".to_owned());
    }
    // Every exported metric is on the dashboard.
    let text = dashboard_exprs(dashboard).join("\n");
    for name in metrics::ALL {
        if !text.contains(name) {
            problems.push(format!("dashboard: no panel shows {name}"));
        }
    }
    problems
}

/// The rules of a Prometheus rule file (`groups:`).
fn rules(groups: &Value) -> Vec<Value> {
    groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn alert_rule_problems(groups: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let rules = rules(groups);
    let mut names = BTreeSet::new();
    let mut exprs = Vec::new();
    for rule in &rules {
        let name = rule["alert"].as_str().unwrap_or("");
        if name.is_empty() || !names.insert(name.to_owned()) {
            problems.push(format!("alerts: missing or repeated alert name {name:?}"));
        }
        let expr = rule["expr"].as_str().unwrap_or("");
        exprs.push(expr.to_owned());
        if rule["labels"]["severity"].as_str().unwrap_or("").is_empty() {
            problems.push(format!("alerts: {name} has no severity label"));
        }
        for annotation in ["summary", "description", "runbook"] {
            let text = rule["annotations"][annotation].as_str().unwrap_or("");
            if text.trim().is_empty() {
                problems.push(format!("alerts: {name} has no {annotation} annotation"));
            }
            for flag in flags_in_prose(text) {
                if !cli().any_flags.contains(&flag) {
                    problems.push(format!("alerts: {name} names unknown flag {flag}"));
                }
            }
        }
    }
    problems.extend(unknown_metrics("alerts", &exprs));
    // The conditions the deployment promises an alert for.
    let all = exprs.join("\n");
    for needle in [
        metrics::SLOT_LAG_BYTES,
        metrics::ACK_FRONTIER_LSN,
        metrics::IN_FLIGHT_EVENTS,
        metrics::DEAD_LETTERED_TOTAL,
        metrics::SLOT_WAL_STATUS,
        "up{job=\"outbox-relay\"}",
    ] {
        if !all.contains(needle) {
            problems.push(format!("alerts: no alert on {needle}"));
        }
    }
    problems
}

/// A Dockerfile's logical lines (continuations joined, comments dropped), as
/// (INSTRUCTION, arguments).
fn dockerfile_instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (instruction, args) = current.split_once(' ').unwrap_or((&current, ""));
                out.push((instruction.to_ascii_uppercase(), args.trim().to_owned()));
                current.clear();
            }
        }
    }
    out
}

/// The final stage's instructions.
fn runtime_stage(text: &str) -> Vec<(String, String)> {
    let all = dockerfile_instructions(text);
    let last_from = all.iter().rposition(|(i, _)| i == "FROM").unwrap_or(0);
    all[last_from..].to_vec()
}

/// The exec-form command of the final stage's HEALTHCHECK.
fn healthcheck_command(dockerfile: &str) -> Result<Vec<String>, String> {
    let stage = runtime_stage(dockerfile);
    let (_, args) = stage
        .iter()
        .find(|(i, _)| i == "HEALTHCHECK")
        .ok_or("no HEALTHCHECK in the runtime stage")?;
    let (_, cmd) = args.split_once("CMD ").ok_or("HEALTHCHECK without CMD")?;
    serde_json::from_str(cmd.trim())
        .map_err(|e| format!("HEALTHCHECK CMD is not exec-form JSON: {e}"))
}

fn dockerfile_problems(dockerfile: &str, cargo_toml: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(e) = healthcheck_command(dockerfile) {
        problems.push(format!("Dockerfile: {e}"));
    }
    let stage = runtime_stage(dockerfile);
    let user = stage
        .iter()
        .rev()
        .find(|(i, _)| i == "USER")
        .map(|(_, a)| a.as_str());
    match user {
        None => {
            problems.push("Dockerfile: the runtime stage sets no USER (runs as root)".to_owned())
        }
        Some(user) => {
            let name = user.split(':').next().unwrap_or(user);
            if name == "0" || name == "root" {
                problems.push(format!("Dockerfile: USER {user} is root"));
            } else if name.parse::<u32>().is_err() {
                problems.push(format!(
                    "Dockerfile: USER {user} is not numeric (runAsNonRoot cannot verify it)"
                ));
            }
        }
    }
    let env: Vec<&str> = stage
        .iter()
        .filter(|(i, _)| i == "ENV")
        .map(|(_, a)| a.as_str())
        .collect();
    if !env.contains(&"OUTBOX_RELAY_HTTP_ADDR=0.0.0.0:9187") {
        problems.push("Dockerfile: ENV OUTBOX_RELAY_HTTP_ADDR=0.0.0.0:9187 missing".to_owned());
    }
    if !stage.iter().any(|(i, a)| i == "EXPOSE" && a == "9187") {
        problems.push("Dockerfile: EXPOSE 9187 missing".to_owned());
    }
    // Cargo parses every target the manifest declares, even for `--bin`: their
    // directories must be copied into the build stage.
    let copied: Vec<String> = dockerfile_instructions(dockerfile)
        .into_iter()
        .filter(|(i, _)| i == "COPY")
        .flat_map(|(_, a)| {
            a.split_whitespace()
                .map(|s| s.trim_start_matches("./").trim_end_matches('/').to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    // [[bin]] and [[bench]] sections (the lib is src/), each with its default
    // directory unless a `path` says otherwise.
    let mut targets: Vec<String> = Vec::new();
    for line in cargo_toml.lines().map(str::trim) {
        if line.starts_with('[') {
            match line {
                "[[bin]]" => targets.push("src".to_owned()),
                "[[bench]]" => targets.push("benches".to_owned()),
                _ => {}
            }
            if !(line == "[[bin]]" || line == "[[bench]]") {
                targets.push(String::new());
            }
        } else if let Some(path) = line
            .strip_prefix("path = \"")
            .and_then(|p| p.strip_suffix('"'))
            && let Some(last) = targets.last_mut()
            && !last.is_empty()
        {
            *last = path.split('/').next().unwrap_or(path).to_owned();
        }
    }
    let needed: BTreeSet<String> = targets.into_iter().filter(|t| !t.is_empty()).collect();
    for dir in needed {
        if !copied.contains(&dir) {
            problems.push(format!(
                "Dockerfile: Cargo.toml declares targets in {dir}/: the build stage needs COPY {dir}"
            ));
        }
    }
    problems
}

/// The relay's container in a pod spec.
fn relay_container(deployment: &Value) -> Value {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| str_of(c, "/image").contains("outbox-relay"))
        .cloned()
        .unwrap_or(Value::Null)
}

fn container_env(container: &Value) -> BTreeMap<String, Value> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| (str_of(e, "/name").to_owned(), e.clone()))
        .collect()
}

fn probe_problems(container: &Value, probe: &str, path: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let get = &container[probe]["httpGet"];
    if get["path"] != path {
        problems.push(format!("{probe} must GET {path}, not {}", get["path"]));
    }
    let ports = container["ports"].as_array().cloned().unwrap_or_default();
    let resolves = ports.iter().any(|p| {
        p["containerPort"] == 9187
            && (get["port"] == p["name"] || get["port"] == p["containerPort"])
    });
    if !resolves {
        problems.push(format!(
            "{probe} port {} is not the container's 9187",
            get["port"]
        ));
    }
    problems
}

fn deployment_problems(deployment: &Value, secret: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if deployment["spec"]["replicas"] != 1 {
        problems.push(format!(
            "Deployment: replicas {} (1 expected)",
            deployment["spec"]["replicas"]
        ));
    }
    if deployment["spec"]["strategy"]["type"] != "Recreate" {
        problems.push("Deployment: strategy must be Recreate".to_owned());
    }
    let pod = pod_problems(deployment, secret, "/readyz");
    problems.extend(pod.into_iter().map(|p| format!("Deployment: {p}")));
    problems
}

/// The sharded StatefulSets (`active` and its `standby` twin): shard I in pod I, the count
/// the same in `replicas` and `OUTBOX_RELAY_SHARD`, the twins equal but for their names.
fn statefulset_problems(active: &Value, standby: &Value, secret: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for set in [active, standby] {
        let name = str_of(set, "/metadata/name");
        let replicas = &set["spec"]["replicas"];
        let env = container_env(&relay_container(set));
        let var = |name: &str| env.get(name).cloned().unwrap_or_default();
        let index = var("POD_INDEX");
        let index = str_of(&index, "/valueFrom/fieldRef/fieldPath");
        if index != "metadata.labels['apps.kubernetes.io/pod-index']" {
            problems.push(format!("{name}: POD_INDEX is not the pod-index label"));
        }
        let shard = var("OUTBOX_RELAY_SHARD");
        let shard = str_of(&shard, "/value");
        if shard != format!("$(POD_INDEX)/{replicas}") {
            problems.push(format!(
                "{name}: OUTBOX_RELAY_SHARD {shard:?} for {replicas} replicas"
            ));
        }
        if set["spec"]["podManagementPolicy"] != "Parallel" {
            problems.push(format!("{name}: podManagementPolicy must be Parallel"));
        }
        if set["spec"]["serviceName"] != "outbox-relay" {
            problems.push(format!("{name}: serviceName must be the Service"));
        }
        let pod = pod_problems(set, secret, "/healthz");
        problems.extend(pod.into_iter().map(|p| format!("{name}: {p}")));
    }
    // The standby set is the active one under another name and component label.
    let component =
        |set: &Value| str_of(set, "/metadata/labels/app.kubernetes.io~1component").to_owned();
    let (a, b) = (component(active), component(standby));
    let renamed = serde_json::to_string(standby)
        .unwrap()
        .replace(
            str_of(standby, "/metadata/name"),
            str_of(active, "/metadata/name"),
        )
        .replace(&format!("\"{b}\""), &format!("\"{a}\""));
    if a == b || serde_json::from_str::<Value>(&renamed).unwrap() != *active {
        problems
            .push("the standby StatefulSet differs from the shards' but for its names".to_owned());
    }
    problems
}

/// The relay's pod template of a Deployment or StatefulSet, readiness on `readiness`.
fn pod_problems(workload: &Value, secret: &Value, readiness: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let container = relay_container(workload);
    if container.is_null() {
        return vec!["no outbox-relay container".to_owned()];
    }
    problems.extend(probe_problems(&container, "livenessProbe", "/healthz"));
    problems.extend(probe_problems(&container, "readinessProbe", readiness));
    let port_named = container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["name"] == "http-metrics" && p["containerPort"] == 9187);
    if !port_named {
        problems.push("container port 9187 must be named http-metrics".to_owned());
    }
    let sc = &container["securityContext"];
    let pod_sc = &workload["spec"]["template"]["spec"]["securityContext"];
    if sc["runAsNonRoot"] != true && pod_sc["runAsNonRoot"] != true {
        problems.push("runAsNonRoot missing".to_owned());
    }
    if sc["readOnlyRootFilesystem"] != true {
        problems.push("readOnlyRootFilesystem missing".to_owned());
    }
    if sc["allowPrivilegeEscalation"] != false {
        problems.push("allowPrivilegeEscalation must be false".to_owned());
    }
    if sc["capabilities"]["drop"] != json!(["ALL"]) {
        problems.push("capabilities must drop ALL".to_owned());
    }
    let resources = &container["resources"];
    for (pointer, want) in [
        ("/requests/cpu", "50m"),
        ("/requests/memory", "64Mi"),
        ("/limits/memory", "128Mi"),
    ] {
        if str_of(resources, pointer) != want {
            problems.push(format!("resources{pointer} must be {want}"));
        }
    }
    let env = container_env(&container);
    if str_of(
        &env.get("OUTBOX_RELAY_HTTP_ADDR")
            .cloned()
            .unwrap_or_default(),
        "/value",
    ) != "0.0.0.0:9187"
    {
        problems.push("OUTBOX_RELAY_HTTP_ADDR must be 0.0.0.0:9187".to_owned());
    }
    let url = env
        .get("OUTBOX_RELAY_POSTGRES_URL")
        .map(|e| str_of(e, "/value").to_owned())
        .unwrap_or_default();
    match url::Url::parse(&url) {
        Ok(url) if url.password().is_none() => {}
        Ok(_) => problems.push("the Postgres URL must not hold a password".to_owned()),
        Err(e) => problems.push(format!("OUTBOX_RELAY_POSTGRES_URL {url:?}: {e}")),
    }
    // The password file is a key of the Secret, mounted where the env var says.
    let file = env
        .get("OUTBOX_RELAY_POSTGRES_PASSWORD_FILE")
        .map(|e| str_of(e, "/value").to_owned())
        .unwrap_or_default();
    let secret_name = str_of(secret, "/metadata/name");
    let volumes = workload["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mounted = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| {
            let Some(rest) = file.strip_prefix(&format!("{}/", str_of(m, "/mountPath"))) else {
                return false;
            };
            volumes.iter().any(|v| {
                v["name"] == m["name"]
                    && v["secret"]["secretName"] == secret_name
                    && v["secret"]["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|i| {
                            i["path"] == rest && secret["stringData"][str_of(i, "/key")].is_string()
                        })
            })
        });
    if !mounted {
        problems.push(format!(
            "OUTBOX_RELAY_POSTGRES_PASSWORD_FILE {file:?} is not a mounted key of Secret {secret_name}"
        ));
    }
    for (name, e) in &env {
        if let Some(key_ref) = e.pointer("/valueFrom/secretKeyRef")
            && (key_ref["name"] != secret_name
                || !secret["stringData"][str_of(key_ref, "/key")].is_string())
        {
            problems.push(format!("{name} refers to a key the Secret lacks"));
        }
    }
    problems
}

fn compose_problems(compose: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let services = &compose["services"];
    for name in [
        "postgres",
        "kafka",
        "relay",
        "demo-writer",
        "prometheus",
        "grafana",
    ] {
        if services[name].is_null() {
            problems.push(format!("compose: no {name} service"));
        }
    }
    let relay_env = &services["relay"]["environment"];
    if relay_env["OUTBOX_RELAY_HTTP_ADDR"] != "0.0.0.0:9187" {
        problems.push("compose: relay needs OUTBOX_RELAY_HTTP_ADDR 0.0.0.0:9187".to_owned());
    }
    // Compose substitutes ${VAR} itself; the relay's own ${...} must be written $${...}.
    for service in services.as_object().into_iter().flat_map(|s| s.values()) {
        for value in service["environment"]
            .as_object()
            .into_iter()
            .flat_map(|e| e.values())
        {
            let text = value.to_string();
            if text.replace("$$", "").contains('$') {
                problems.push(format!(
                    "compose: {text} would be interpolated by Compose; write $$"
                ));
            }
        }
    }
    let postgres_command = services["postgres"]["command"].to_string();
    if !postgres_command.contains("wal_level=logical") {
        problems.push("compose: postgres must run with wal_level=logical".to_owned());
    }
    // Every bind mount's source exists in the repository.
    for (name, service) in services.as_object().into_iter().flatten() {
        for volume in service["volumes"].as_array().into_iter().flatten() {
            let source = volume
                .as_str()
                .unwrap_or("")
                .split(':')
                .next()
                .unwrap_or("");
            if source.starts_with("./") && !root().join(source).exists() {
                problems.push(format!(
                    "compose: {name} mounts {source}, which does not exist"
                ));
            }
        }
    }
    problems
}

// --- the tests ---------------------------------------------------------------------------

#[test]
fn every_yaml_and_json_file_parses() {
    let yaml = yaml_files();
    for expected in [
        "deploy/kubernetes/deployment.yaml",
        "deploy/prometheus/alerts.yml",
        "deploy/grafana/provisioning/dashboards/outbox-relay.yml",
        "docker-compose.yml",
    ] {
        assert!(
            yaml.contains(&expected.to_owned()),
            "{expected} missing: {yaml:?}"
        );
    }
    for file in &yaml {
        let docs = load_yaml(file);
        assert!(
            docs.iter().all(Value::is_object),
            "{file}: every document is a mapping"
        );
    }
    let json_files: Vec<String> = deploy_files()
        .into_iter()
        .filter(|f| f.ends_with(".json"))
        .collect();
    assert!(json_files.contains(&"deploy/grafana/outbox-relay.json".to_owned()));
    for file in &json_files {
        serde_json::from_str::<Value>(&read(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

#[test]
fn environment_variables_are_the_relays() {
    let known = &cli().env_vars;
    let mut files = deploy_files();
    files.push("docker-compose.yml".to_owned());
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for file in files.iter().filter(|f| !f.ends_with(".json")) {
        let text = read(file);
        seen.extend(env_vars_in(&text));
        problems.extend(unknown_env_vars(file, &text, known));
    }
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        seen.contains("OUTBOX_RELAY_POSTGRES_PASSWORD_FILE"),
        "{seen:?}"
    );
}

#[test]
fn flags_are_the_relays() {
    let mut problems = Vec::new();
    let deployment = manifest("deploy/kubernetes/deployment.yaml", "Deployment");
    let (shards, standby) = statefulsets();
    for (file, workload) in [
        ("deployment.yaml", &deployment),
        ("statefulset.yaml", &shards),
        ("statefulset.yaml", &standby),
    ] {
        let container = relay_container(workload);
        for key in ["command", "args"] {
            let args: Vec<String> = container[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect();
            problems.extend(unknown_flags(file, &args, &cli().relay_flags));
        }
    }
    let compose = &load_yaml("docker-compose.yml")[0];
    let command = &compose["services"]["relay"]["command"];
    let args: Vec<String> = match command {
        Value::String(s) => s.split_whitespace().map(str::to_owned).collect(),
        other => other
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect(),
    };
    problems.extend(unknown_flags(
        "docker-compose.yml relay",
        &args,
        &cli().relay_flags,
    ));
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn alert_rules_name_real_metrics_and_say_what_to_do() {
    let alerts = &load_yaml("deploy/prometheus/alerts.yml")[0];
    let problems = alert_rule_problems(alerts);
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(rules(alerts).len() >= 5);

    // The PrometheusRule carries exactly the same groups.
    let rule = manifest("deploy/kubernetes/prometheusrule.yaml", "PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        &rule["spec"], alerts,
        "prometheusrule.yaml and alerts.yml differ"
    );

    // Prometheus (compose) loads them and scrapes the relay under the job the alerts name,
    // as does the ServiceMonitor through the Service's name.
    let prometheus = &load_yaml("deploy/prometheus/prometheus.yml")[0];
    assert_eq!(prometheus["rule_files"], json!(["alerts.yml"]));
    let job = &prometheus["scrape_configs"][0];
    assert_eq!(job["job_name"], "outbox-relay");
    assert_eq!(job["static_configs"][0]["targets"], json!(["relay:9187"]));
    let service = manifest("deploy/kubernetes/service.yaml", "Service");
    assert_eq!(service["metadata"]["name"], "outbox-relay");
}

#[test]
fn dashboard_queries_real_metrics() {
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/outbox-relay.json")).unwrap();
    let problems = dashboard_problems(&dashboard);
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(dashboard["schemaVersion"].as_u64() >= Some(39));
    let exprs = dashboard_exprs(&dashboard).join("\n");
    assert!(
        exprs.contains("histogram_quantile(0.99"),
        "p99 latency panel"
    );
    assert!(exprs.contains(" - outbox_relay_ack_frontier_lsn{"));

    // Grafana (compose) provisions it from where compose mounts it.
    let provider = &load_yaml("deploy/grafana/provisioning/dashboards/outbox-relay.yml")[0];
    let dir = str_of(provider, "/providers/0/options/path");
    let compose = &load_yaml("docker-compose.yml")[0];
    let mounts = compose["services"]["grafana"]["volumes"].to_string();
    assert!(
        mounts.contains(&format!(
            "./deploy/grafana/outbox-relay.json:{dir}/outbox-relay.json"
        )),
        "{mounts}"
    );
    let datasource = &load_yaml("deploy/grafana/provisioning/datasources/prometheus.yml")[0];
    assert_eq!(
        datasource["datasources"][0]["url"],
        "http://prometheus:9090"
    );
}

#[test]
fn kubernetes_manifests_deploy_one_safe_relay() {
    let deployment = manifest("deploy/kubernetes/deployment.yaml", "Deployment");
    let secret = manifest("deploy/kubernetes/secret.yaml", "Secret");
    let problems = deployment_problems(&deployment, &secret);
    assert!(problems.is_empty(), "{problems:#?}");

    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let service = manifest("deploy/kubernetes/service.yaml", "Service");
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels[k], v, "the Service selects the relay's pods");
    }
    assert_eq!(service["spec"]["ports"][0]["name"], "http-metrics");
    assert_eq!(service["spec"]["ports"][0]["port"], 9187);
    let monitor = manifest("deploy/kubernetes/servicemonitor.yaml", "ServiceMonitor");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http-metrics");
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "the ServiceMonitor selects the Service"
        );
    }
    // The kustomization applies every manifest.
    let kustomization = &load_yaml("deploy/kubernetes/kustomization.yaml")[0];
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("deploy/kubernetes/{}", r.as_str().unwrap()))
        .collect();
    let present: BTreeSet<String> = deploy_files()
        .into_iter()
        .filter(|f| f.starts_with("deploy/kubernetes/") && !f.ends_with("kustomization.yaml"))
        .filter(|f| !f.starts_with("deploy/kubernetes/sharded/"))
        .collect();
    assert_eq!(listed, present);
}

/// The two StatefulSets of the sharded deployment: the shards, then their standbys.
fn statefulsets() -> (Value, Value) {
    let mut sets: Vec<Value> = load_yaml("deploy/kubernetes/sharded/statefulset.yaml")
        .into_iter()
        .filter(|d| d["kind"] == "StatefulSet")
        .collect();
    assert_eq!(sets.len(), 2, "the shards and their standbys");
    let standby = sets.remove(1);
    (sets.remove(0), standby)
}

#[test]
fn kubernetes_runs_shards_each_with_a_standby() {
    let (active, standby) = statefulsets();
    let secret = manifest("deploy/kubernetes/secret.yaml", "Secret");
    let problems = statefulset_problems(&active, &standby, &secret);
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(active["spec"]["replicas"], standby["spec"]["replicas"]);
    // The Service (and so the ServiceMonitor) selects every shard's pods.
    let service = manifest("deploy/kubernetes/service.yaml", "Service");
    for set in [&active, &standby] {
        let labels = &set["spec"]["template"]["metadata"]["labels"];
        for (k, v) in service["spec"]["selector"].as_object().unwrap() {
            assert_eq!(&labels[k], v, "the Service selects the shards' pods");
        }
    }
    // The sharded kustomization takes the rest from deploy/kubernetes but its Deployment:
    // one relay and shards would relay every event twice.
    let kustomization = &load_yaml("deploy/kubernetes/sharded/kustomization.yaml")[0];
    assert_eq!(
        kustomization["resources"],
        json!(["..", "statefulset.yaml"])
    );
    let patch = parse_yaml(str_of(kustomization, "/patches/0/patch")).unwrap();
    assert_eq!(patch[0]["$patch"], "delete");
    assert_eq!(patch[0]["kind"], "Deployment");
    let deployment = manifest("deploy/kubernetes/deployment.yaml", "Deployment");
    assert_eq!(patch[0]["metadata"]["name"], deployment["metadata"]["name"]);
}

#[test]
fn compose_runs_the_whole_demo() {
    let compose = &load_yaml("docker-compose.yml")[0];
    let problems = compose_problems(compose);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn dockerfile_builds_a_non_root_image_with_a_health_check() {
    let problems = dockerfile_problems(&read("deploy/Dockerfile"), &read("Cargo.toml"));
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Runs `argv` with `env` until it exits (or `timeout`): its exit code.
fn run_for(argv: &[String], env: &[(&str, String)], timeout: Duration) -> Option<i32> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[tokio::test(flavor = "current_thread")]
async fn dockerfile_health_check_passes_on_a_running_relay_only() {
    let command = healthcheck_command(&read("deploy/Dockerfile")).unwrap();
    let world = World::start().await;
    let mut relay = Relay::spawn(&world.pg.url(), &world.broker.bootstrap(), &[]);
    let port = relay.wait_http_port();
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(port, "/healthz").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let env = [("OUTBOX_RELAY_HTTP_ADDR", addr.clone())];
    assert_eq!(
        run_for(&command, &env, Duration::from_secs(10)),
        Some(0),
        "{}",
        relay.log()
    );
    relay.kill();
    let code = run_for(&command, &env, Duration::from_secs(10));
    assert!(
        code.is_some_and(|c| c != 0),
        "healthy without a relay: {code:?}"
    );
}

/// How a relay started with a deployment's configuration went.
#[derive(Debug, PartialEq, Eq)]
enum Started {
    /// It validated the configuration and waited for Postgres (pointed at a closed port),
    /// saying so on /readyz, then stopped on SIGTERM with this exit code.
    WaitedForPostgres(Option<i32>),
    /// It exited by itself with this code (2: a configuration error).
    Exited(Option<i32>),
    /// It ran for a minute without /readyz saying it waits for Postgres, then stopped on
    /// SIGTERM with this exit code.
    NeverSaidItWaits(Option<i32>),
}

/// Runs the relay with a deployment's environment and arguments, Postgres pointed at a
/// closed port: waiting for it means the configuration validated.
fn start_with(env: &BTreeMap<String, String>, args: &[String]) -> (Started, String) {
    let mut env = env.clone();
    if let Some(url) = env.get_mut("OUTBOX_RELAY_POSTGRES_URL") {
        let mut parsed = url::Url::parse(url).expect("the Postgres URL parses");
        parsed.set_host(Some("127.0.0.1")).unwrap();
        parsed.set_port(Some(1)).unwrap();
        *url = parsed.to_string();
    }
    let dir = tempfile::tempdir().unwrap();
    let addr_file = dir.path().join("http-addr");
    env.insert(
        "OUTBOX_RELAY_HTTP_ADDR".to_owned(),
        "127.0.0.1:0".to_owned(),
    );
    env.insert(
        "OUTBOX_RELAY_HTTP_ADDR_FILE".to_owned(),
        addr_file.to_string_lossy().into_owned(),
    );
    let log = dir.path().join("relay.log");
    let mut child = Command::new(binary())
        .args(args)
        .env_clear()
        .envs(&env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("run outbox-relay");
    let waiting = |addr: &str| {
        let port = addr.trim().rsplit(':').next()?.parse().ok()?;
        let (_, body) = get(port, "/readyz")?;
        Some(body.contains("start-up waits: Postgres at"))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let started = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Started::Exited(status.code());
        }
        let addr = std::fs::read_to_string(&addr_file).unwrap_or_default();
        let said_it_waits = waiting(&addr) == Some(true);
        if said_it_waits || Instant::now() >= deadline {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let stopped = child.wait().expect("the relay stops");
            break match said_it_waits {
                true => Started::WaitedForPostgres(stopped.code()),
                false => Started::NeverSaidItWaits(stopped.code()),
            };
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    (started, log)
}

#[test]
fn relay_accepts_the_compose_and_kubernetes_configuration() {
    let waited = Started::WaitedForPostgres(Some(0));
    let compose = &load_yaml("docker-compose.yml")[0];
    let env: BTreeMap<String, String> = compose["services"]["relay"]["environment"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str()
                    .map_or(v.to_string(), str::to_owned)
                    .replace("$$", "$"),
            )
        })
        .collect();
    assert_eq!(
        env["OUTBOX_RELAY_TOPIC_TEMPLATE"],
        "outbox.event.${routedByValue}"
    );
    let (started, log) = start_with(&env, &[]);
    assert_eq!(started, waited, "compose's relay configuration: {log}");

    // Kubernetes: values, Secret references resolved, the password file written.
    let deployment = manifest("deploy/kubernetes/deployment.yaml", "Deployment");
    let (shards, _) = statefulsets();
    for workload in [deployment, shards] {
        let (started, log) = start_kubernetes(&workload);
        assert_eq!(
            started, waited,
            "the {} relay configuration: {log}",
            workload["kind"]
        );
    }
}

/// Runs the relay as `workload`'s pod 3 would: values, Secret references and `$(VAR)`
/// resolved, the password file written.
fn start_kubernetes(workload: &Value) -> (Started, String) {
    let secret = manifest("deploy/kubernetes/secret.yaml", "Secret");
    let container = relay_container(workload);
    let dir = tempfile::tempdir().unwrap();
    let mut env = BTreeMap::new();
    for (name, e) in container_env(&container) {
        let value = match e.pointer("/valueFrom") {
            Some(from) if from.pointer("/fieldRef").is_some() => "3".to_owned(),
            Some(from) => {
                let key = str_of(from, "/secretKeyRef/key");
                str_of(&secret, &format!("/stringData/{key}")).to_owned()
            }
            None => str_of(&e, "/value").to_owned(),
        };
        env.insert(name, value);
    }
    // Kubernetes expands $(NAME) of a variable defined before; the test's are in order.
    for (name, value) in env.clone() {
        for v in env.values_mut() {
            *v = v.replace(&format!("$({name})"), &value);
        }
    }
    let password_file = dir.path().join("postgres-password");
    std::fs::write(
        &password_file,
        str_of(&secret, "/stringData/postgres-password"),
    )
    .unwrap();
    env.insert(
        "OUTBOX_RELAY_POSTGRES_PASSWORD_FILE".to_owned(),
        password_file.to_string_lossy().into_owned(),
    );
    let args: Vec<String> = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    start_with(&env, &args)
}

/// Each check above finds the mistake it exists for.
#[test]
fn checks_catch_mistakes() {
    // A misspelled metric, an unknown function, a bucket of a non-histogram.
    assert_eq!(
        unknown_metrics("t", &["rate(outbox_relay_events_relayed_total[5m])".into()]).len(),
        0
    );
    assert_eq!(
        unknown_metrics("t", &["outbox_relay_slot_lag_byte > 1".into()]).len(),
        1
    );
    assert_eq!(
        unknown_metrics(
            "t",
            &["rate(outbox_relay_in_flight_events_count[5m])".into()]
        )
        .len(),
        1
    );
    assert_eq!(
        unknown_metrics(
            "t",
            &["histogram_quantile(0.5, outbox_relay_commit_to_ack_seconds_bucket)".into()]
        )
        .len(),
        0
    );
    assert_eq!(
        unknown_metrics("t", &["sum(rate(x[5m]) by (topic)".into()]).len(),
        1,
        "parse error"
    );

    // Unknown env vars and flags.
    let env = &cli().env_vars;
    assert!(
        unknown_env_vars("f", "OUTBOX_RELAY_HTTP_ADDR: x, OUTBOX_RELAY_<NAME>", env).is_empty()
    );
    assert_eq!(
        unknown_env_vars("f", "OUTBOX_RELAY_HTTP_ADRR: x", env).len(),
        1
    );
    let flags = &cli().relay_flags;
    assert!(
        unknown_flags(
            "f",
            &["--http-addr=0.0.0.0:1".into(), "-X".into(), "a=b".into()],
            flags
        )
        .is_empty()
    );
    assert_eq!(
        unknown_flags("f", &["--http-address".into()], flags).len(),
        1
    );
    assert_eq!(
        flags_in_prose("raise --max-in-flight-events, or `--http-addr=x`."),
        BTreeSet::from([
            "--max-in-flight-events".to_owned(),
            "--http-addr".to_owned()
        ])
    );

    // The dashboard: a misspelled metric in a panel, a lost datasource variable.
    let good: Value = serde_json::from_str(&read("deploy/grafana/outbox-relay.json")).unwrap();
    let mut bad = good.clone();
    bad["panels"][1]["targets"][0]["expr"] = json!("outbox_relay_build_inf");
    assert!(
        dashboard_problems(&bad)
            .iter()
            .any(|p| p.contains("outbox_relay_build_inf ")),
        "{:?}",
        dashboard_problems(&bad)
    );
    let mut bad = good.clone();
    bad["panels"][1]["datasource"]["uid"] = json!("prometheus");
    assert_eq!(dashboard_problems(&bad).len(), 1);

    // Alerts: a misspelled metric, a missing runbook, an unknown flag in one.
    let good = load_yaml("deploy/prometheus/alerts.yml").remove(0);
    let mut bad = good.clone();
    bad["groups"][0]["rules"][1]["expr"] = json!("outbox_relay_slot_lag > 1");
    assert!(
        alert_rule_problems(&bad)
            .iter()
            .any(|p| p.contains("outbox_relay_slot_lag "))
    );
    let mut bad = good.clone();
    bad["groups"][0]["rules"][0]["annotations"]["runbook"] = json!("");
    assert_eq!(alert_rule_problems(&bad).len(), 1);
    let mut bad = good.clone();
    bad["groups"][0]["rules"][0]["annotations"]["runbook"] = json!("set --http-adress");
    assert_eq!(alert_rule_problems(&bad).len(), 1);

    // Deployment: RollingUpdate, 2 replicas, swapped probes, a password in the URL,
    // a capability kept.
    let deployment = manifest("deploy/kubernetes/deployment.yaml", "Deployment");
    let secret = manifest("deploy/kubernetes/secret.yaml", "Secret");
    let mut bad = deployment.clone();
    bad["spec"]["strategy"]["type"] = json!("RollingUpdate");
    bad["spec"]["replicas"] = json!(2);
    assert_eq!(deployment_problems(&bad, &secret).len(), 2);
    let mut bad = deployment.clone();
    let c = &mut bad["spec"]["template"]["spec"]["containers"][0];
    c["livenessProbe"]["httpGet"]["path"] = json!("/readyz");
    c["readinessProbe"]["httpGet"]["path"] = json!("/healthz");
    c["securityContext"]["capabilities"]["drop"] = json!(["NET_RAW"]);
    c["env"][0]["value"] = json!("postgres://u:secret@db/app");
    assert_eq!(
        deployment_problems(&bad, &secret).len(),
        4,
        "{:?}",
        deployment_problems(&bad, &secret)
    );
    let mut bad = deployment.clone();
    bad["spec"]["template"]["spec"]["volumes"][0]["secret"]["items"][0]["key"] = json!("nope");
    assert_eq!(deployment_problems(&bad, &secret).len(), 1);

    // StatefulSets: a replica count OUTBOX_RELAY_SHARD does not name, a standby unlike
    // its shard, readiness on /readyz (a standby would stall every rollout).
    let (active, standby) = statefulsets();
    assert!(statefulset_problems(&active, &standby, &secret).is_empty());
    let mut bad = active.clone();
    bad["spec"]["replicas"] = json!(5);
    assert_eq!(statefulset_problems(&bad, &standby, &secret).len(), 2);
    let mut bad = standby.clone();
    bad["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["--log-format", "text"]);
    assert_eq!(statefulset_problems(&active, &bad, &secret).len(), 1);
    let mut bad = standby.clone();
    let probe = &mut bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"];
    probe["httpGet"]["path"] = json!("/readyz");
    assert_eq!(
        statefulset_problems(&active, &bad, &secret).len(),
        2,
        "{:?}",
        statefulset_problems(&active, &bad, &secret)
    );

    // Compose: a single $ in the relay's template, a missing mount source.
    let compose = load_yaml("docker-compose.yml").remove(0);
    let mut bad = compose.clone();
    bad["services"]["relay"]["environment"]["OUTBOX_RELAY_TOPIC_TEMPLATE"] =
        json!("outbox.${routedByValue}");
    bad["services"]["prometheus"]["volumes"][0] =
        json!("./deploy/prometheus-gone:/etc/prometheus:ro");
    assert_eq!(
        compose_problems(&bad).len(),
        2,
        "{:?}",
        compose_problems(&bad)
    );

    // Dockerfile: no HEALTHCHECK, root, no benches copied.
    let dockerfile = read("deploy/Dockerfile");
    let cargo_toml = read("Cargo.toml");
    let without: String = dockerfile
        .replace("HEALTHCHECK", "# HEALTHCHECK")
        .replace("USER 10001:10001", "USER root")
        .replace("COPY benches ./benches", "");
    assert_eq!(
        dockerfile_problems(&without, &cargo_toml).len(),
        3,
        "{:?}",
        dockerfile_problems(&without, &cargo_toml)
    );
}

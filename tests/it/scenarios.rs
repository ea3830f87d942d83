//! Plays every scenario in `fixtures/scenarios/` through a real gateway in front of
//! a cluster of Moodle stand-ins. The format is described in `fixtures/README.md`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use axum::body::Body;
use serde::Deserialize;

use moodle_gateway::demo::standin::Cluster;

use crate::support::{self, Seen, TestGateway};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    description: String,
    #[serde(default)]
    setup: Setup,
    step: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Setup {
    nodes: usize,
    dead_nodes: usize,
    weights: Vec<u32>,
    site_path: String,
    cookie: String,
    config: String,
    session: String,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            nodes: 4,
            dead_nodes: 0,
            weights: Vec::new(),
            site_path: String::new(),
            cookie: "MoodleSession".into(),
            config: String::new(),
            session: String::new(),
        }
    }
}

type Pairs = Vec<(String, String)>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    name: String,
    #[serde(default = "get")]
    method: String,
    path: String,
    #[serde(default)]
    headers: Pairs,
    #[serde(default)]
    body: String,
    #[serde(default = "yes")]
    use_jar: bool,
    #[serde(default = "one")]
    repeat: usize,
    status: Option<u16>,
    upstream: Option<String>,
    new_session: Option<bool>,
    #[serde(default)]
    headers_out: Pairs,
    #[serde(default)]
    no_headers_out: Vec<String>,
    #[serde(default)]
    upstream_saw: Pairs,
    #[serde(default)]
    upstream_lacks: Vec<String>,
    upstream_uri: Option<String>,
    body_contains: Option<String>,
    body_lacks: Option<String>,
    #[serde(default)]
    bound: Pairs,
    #[serde(default)]
    unbound: Vec<String>,
    #[serde(default)]
    state: Pairs,
    save_upstream: Option<String>,
    save_session: Option<String>,
    save_token: Option<String>,
}

fn get() -> String {
    "GET".into()
}
fn yes() -> bool {
    true
}
fn one() -> usize {
    1
}

/// One scenario's world: the stand-ins, the gateway, the cookie jar and saved values.
struct Play {
    cluster: Cluster,
    gateway: TestGateway,
    cookie: String,
    jar: Option<String>,
    vars: HashMap<String, String>,
}

fn scenario_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_in_fixtures_plays_as_written() {
    let files = scenario_files();
    assert!(files.len() >= 20, "only {} scenarios", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(file).unwrap();
        let scenario: Scenario = match toml::from_str(&text) {
            Ok(scenario) => scenario,
            Err(error) => {
                failures.push(format!("{name}: unreadable: {error}"));
                continue;
            }
        };
        if let Err(error) = play(&scenario).await {
            failures.push(format!("{name}: {error}\n    ({})", scenario.description));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

async fn play(scenario: &Scenario) -> Result<(), String> {
    let setup = &scenario.setup;
    let cluster = Cluster::spawn(setup.nodes, &setup.site_path, &setup.cookie)
        .map_err(|e| format!("stand-ins did not start: {e}"))?;
    let config = gateway_config(&cluster, setup).await;
    let gateway = TestGateway::start(&config).await;
    let mut play = Play {
        cluster,
        gateway,
        cookie: setup.cookie.clone(),
        jar: None,
        vars: HashMap::new(),
    };
    for step in &scenario.step {
        for round in 0..step.repeat {
            play.step(step)
                .await
                .map_err(|e| format!("step {:?} (#{}): {e}", step.name, round + 1))?;
        }
    }
    let lost = play.cluster.lost_sessions();
    play.gateway.shutdown().await;
    if lost > 0 {
        return Err(format!(
            "{lost} request(s) reached a node that did not hold their session"
        ));
    }
    Ok(())
}

async fn gateway_config(cluster: &Cluster, setup: &Setup) -> String {
    let mut text = format!(
        "listen = \"127.0.0.1:0\"\n{}\n[site]\npath = \"{}\"\n[session]\ncookie = \"{}\"\n{}\n",
        setup.config, setup.site_path, setup.cookie, setup.session
    );
    for (i, node) in cluster.nodes().iter().enumerate() {
        let weight = setup.weights.get(i).copied().unwrap_or(1);
        text.push_str(&format!(
            "[[nodes]]\nname = \"{}\"\nurl = \"http://{}\"\nweight = {weight}\n",
            node.name(),
            node.addr()
        ));
    }
    for i in 0..setup.dead_nodes {
        let addr = support::refused_addr().await;
        text.push_str(&format!(
            "[[nodes]]\nname = \"dead{}\"\nurl = \"http://{addr}\"\n",
            i + 1
        ));
    }
    text.push_str(&format!(
        "[data]\nname = \"data\"\nurl = \"http://{}\"\n",
        cluster.data().addr()
    ));
    text
}

impl Play {
    fn fill(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (name, value) in &self.vars {
            out = out.replace(&format!("{{{name}}}"), value);
        }
        out
    }

    async fn step(&mut self, step: &Step) -> Result<(), String> {
        let mut headers: Pairs = step
            .headers
            .iter()
            .map(|(n, v)| (n.clone(), self.fill(v)))
            .collect();
        if step.use_jar {
            if let Some(id) = &self.jar {
                headers.push(("cookie".into(), format!("{}={id}", self.cookie)));
            }
        }
        let borrowed: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let url = self.gateway.url(&self.fill(&step.path));
        let seen = support::send(
            &url,
            &step.method,
            &borrowed,
            Body::from(self.fill(&step.body)),
        )
        .await;
        let before = self.jar.clone();
        if step.use_jar {
            self.follow_set_cookie(&seen);
        }
        // Captures first, so a step can check what it just saved (`bound = [["{user}", ...]]`).
        self.save(step, &seen);
        self.check_response(step, &seen, before)?;
        self.check_upstream(step, &seen)?;
        self.check_table(step)
    }

    /// The jar keeps the last value the response set for the session cookie.
    fn follow_set_cookie(&mut self, seen: &Seen) {
        for line in seen.headers.get_all("set-cookie") {
            let line = line.to_str().unwrap_or_default();
            let pair = line.split(';').next().unwrap_or_default();
            if let Some((name, value)) = pair.split_once('=') {
                if name.trim() == self.cookie {
                    let value = value.trim();
                    let cleared =
                        value.is_empty() || value == "deleted" || line.contains("Max-Age=0");
                    self.jar = (!cleared).then(|| value.to_owned());
                }
            }
        }
    }

    fn check_response(
        &self,
        step: &Step,
        seen: &Seen,
        before: Option<String>,
    ) -> Result<(), String> {
        if let Some(status) = step.status {
            expect(seen.status.as_u16() == status, || {
                format!(
                    "status {} (wanted {status}); body {:?}",
                    seen.status,
                    seen.text()
                )
            })?;
        }
        if let Some(wanted) = &step.upstream {
            let wanted = self.fill(wanted);
            let got = seen.upstream().unwrap_or("none");
            let ok = match wanted.as_str() {
                "node" => got.starts_with("web"),
                other => got == other,
            };
            expect(ok, || {
                format!(
                    "answered by {got}, wanted {wanted} (status {})",
                    seen.status
                )
            })?;
        }
        if let Some(wanted) = step.new_session {
            let changed = step.use_jar && self.jar != before && self.jar.is_some();
            let set = changed || (!step.use_jar && has_session_cookie(seen, &self.cookie));
            expect(set == wanted, || {
                format!("new session: {set}, wanted {wanted}")
            })?;
        }
        let mut names: Vec<&str> = step.headers_out.iter().map(|(n, _)| n.as_str()).collect();
        names.dedup();
        for name in names {
            let want: Vec<String> = step
                .headers_out
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| self.fill(v))
                .collect();
            let got: Vec<String> = seen
                .headers
                .get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect();
            expect(got == want, || {
                format!("response {name}: {got:?}, wanted {want:?}")
            })?;
        }
        for name in &step.no_headers_out {
            expect(!seen.headers.contains_key(name.as_str()), || {
                format!("response carries {name}")
            })?;
        }
        let body = seen.text();
        if let Some(text) = &step.body_contains {
            let text = self.fill(text);
            expect(body.contains(&text), || {
                format!("body lacks {text:?}: {body:?}")
            })?;
        }
        if let Some(text) = &step.body_lacks {
            expect(!body.contains(&self.fill(text)), || {
                format!("body contains {text:?}: {body:?}")
            })?;
        }
        Ok(())
    }

    fn check_upstream(&self, step: &Step, seen: &Seen) -> Result<(), String> {
        if step.upstream_saw.is_empty()
            && step.upstream_lacks.is_empty()
            && step.upstream_uri.is_none()
        {
            return Ok(());
        }
        let name = seen.upstream().ok_or("no upstream answered")?;
        let standin = self
            .cluster
            .by_name(name)
            .ok_or_else(|| format!("no stand-in named {name}"))?;
        let request = standin
            .last_request()
            .ok_or("the upstream recorded no request")?;
        for (header, value) in &step.upstream_saw {
            let got: Vec<String> = request
                .headers
                .get_all(header.as_str())
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect();
            expect(got == [self.fill(value)], || {
                format!("{name} saw {header}: {got:?}, wanted [{value:?}]")
            })?;
        }
        for header in &step.upstream_lacks {
            expect(!request.headers.contains_key(header.as_str()), || {
                format!("{name} saw {header}")
            })?;
        }
        if let Some(uri) = &step.upstream_uri {
            let got = request.uri.to_string();
            expect(&got == uri, || {
                format!("{name} saw URI {got}, wanted {uri}")
            })?;
        }
        Ok(())
    }

    fn check_table(&self, step: &Step) -> Result<(), String> {
        let gateway = self.gateway.app.gateway();
        let table = gateway.table();
        let node_of = |id: &str| table.view(table.key(id)).map(|entry| entry.node);
        for (id, node) in &step.bound {
            let (id, node) = (self.fill(id), self.fill(node));
            let got =
                node_of(&id).and_then(|n| Some(gateway.settings().upstreams.get(n)?.name.clone()));
            expect(got.as_deref() == Some(node.as_str()), || {
                format!("session {id} bound to {got:?}, wanted {node}")
            })?;
        }
        for id in &step.unbound {
            let id = self.fill(id);
            expect(node_of(&id).is_none(), || {
                format!("session {id} is still bound")
            })?;
        }
        for (id, state) in &step.state {
            let id = self.fill(id);
            let got = table
                .view(table.key(&id))
                .map(|entry| serde_json::to_value(entry.state).unwrap());
            expect(got == Some(serde_json::Value::from(state.as_str())), || {
                format!("session {id} state {got:?}, wanted {state}")
            })?;
        }
        Ok(())
    }

    fn save(&mut self, step: &Step, seen: &Seen) {
        if let Some(var) = &step.save_upstream {
            self.vars
                .insert(var.clone(), seen.upstream().unwrap_or("none").to_owned());
        }
        if let Some(var) = &step.save_session {
            self.vars
                .insert(var.clone(), self.jar.clone().unwrap_or_default());
        }
        if let Some(var) = &step.save_token {
            let body = seen.text();
            let token = body
                .split("logintoken=")
                .nth(1)
                .map(|rest| {
                    rest.chars()
                        .take_while(char::is_ascii_alphanumeric)
                        .collect()
                })
                .unwrap_or_default();
            self.vars.insert(var.clone(), token);
        }
    }
}

fn has_session_cookie(seen: &Seen, cookie: &str) -> bool {
    seen.headers.get_all("set-cookie").iter().any(|line| {
        line.to_str()
            .is_ok_and(|l| l.starts_with(&format!("{cookie}=")))
    })
}

fn expect(ok: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(message())
    }
}

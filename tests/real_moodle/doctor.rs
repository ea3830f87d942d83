//! `moodle-gateway doctor` against the real Moodle: a healthy cluster passes, and each
//! broken setup the suite can make is named by node and setting. The doctor needs no
//! running gateway: it reads the gateway's config and asks the nodes itself.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::cluster::{admin_addr, config_for, with_low_pools, Cluster, Store, WORKERS};
use crate::processes::{free_port, Scratch};
use crate::site::Site;

/// What one doctor run said.
pub struct Diagnosis {
    pub code: Option<i32>,
    pub report: Value,
    pub stderr: String,
}

impl Diagnosis {
    /// The findings as (node, setting) pairs.
    pub fn findings(&self) -> Vec<(String, String)> {
        let list = self.report["findings"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        list.iter()
            .map(|f| {
                let text = |k: &str| f[k].as_str().unwrap_or_default().to_owned();
                (text("node"), text("setting"))
            })
            .collect()
    }

    fn explain(&self) -> String {
        format!(
            "exit {:?}\n{}\n{}",
            self.code,
            serde_json::to_string_pretty(&self.report).unwrap_or_default(),
            self.stderr
        )
    }

    /// Exits 1 with exactly one finding per node in `nodes`, for `setting`, and no other.
    pub fn finds(&self, nodes: &[&str], setting: &str) {
        assert_eq!(self.code, Some(1), "{}", self.explain());
        let expected: Vec<(String, String)> = nodes
            .iter()
            .map(|n| (n.to_string(), setting.to_string()))
            .collect();
        assert_eq!(self.findings(), expected, "{}", self.explain());
        for finding in self.report["findings"].as_array().unwrap() {
            for key in ["saw", "why", "fix"] {
                assert!(
                    !finding[key].as_str().unwrap_or_default().is_empty(),
                    "every finding says what it saw, why and the fix: {finding}"
                );
            }
        }
    }

    pub fn healthy(&self) {
        assert_eq!(self.code, Some(0), "{}", self.explain());
        assert!(self.findings().is_empty(), "{}", self.explain());
    }
}

/// Runs `moodle-gateway doctor --json` on `config`, logging in as `login` (username,
/// password) when given.
pub fn doctor(config: &str, login: Option<(&str, &str)>) -> Diagnosis {
    let mut args = vec!["--json"];
    let mut env = Vec::new();
    if let Some((user, password)) = login {
        args.extend(["--login", user]);
        env.push(("MOODLE_GATEWAY_DOCTOR_PASSWORD", password));
    }
    let (code, stdout, stderr) = run_doctor(config, &args, &env);
    Diagnosis {
        code,
        report: serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("the doctor's --json parses ({e}): {stdout}\n{stderr}")),
        stderr,
    }
}

/// `moodle-gateway doctor --config F ARGS` in a directory of its own, `config` written
/// there with the token and secret files the suite's configs name: exit code, stdout
/// and stderr.
fn run_doctor(config: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dir = Scratch::new("doctor");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config).unwrap();
    std::fs::write(
        dir.path().join("admin.token"),
        "real-moodle-suite-doctor-token-0123\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("route.secret"),
        "real-moodle-suite-doctor-secret-01234\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
        .current_dir(dir.path())
        .args(["doctor", "--config"])
        .arg(&path)
        .args(args)
        .env_remove("MOODLE_GATEWAY_ADMIN_TOKEN")
        .env_remove("MOODLE_GATEWAY_DOCTOR_PASSWORD")
        .envs(env.iter().copied())
        .output()
        .expect("the doctor runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    eprintln!("doctor {args:?}:\n{stdout}{stderr}");
    (output.status.code(), stdout, stderr)
}

/// The doctor's config for `cluster`: the suite's gateway config, which the doctor reads.
pub fn config(cluster: &Cluster) -> String {
    config_for(cluster, admin_addr())
}

/// No session file on any node still holds `username` logged in: the doctor logged out
/// everywhere it logged in.
pub fn nobody_left_logged_in(cluster: &Cluster, dataroot: &Path, username: &str) {
    let needle = format!("\"{username}\"");
    let mut dirs: Vec<std::path::PathBuf> =
        cluster.all().filter_map(|n| n.sessions.clone()).collect();
    dirs.push(dataroot.join("sessions"));
    for dir in dirs {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let text = String::from_utf8_lossy(&std::fs::read(entry.path()).unwrap_or_default())
                .into_owned();
            assert!(
                !text.contains(&needle),
                "{} still holds a session of {username}",
                entry.path().display()
            );
        }
    }
}

pub fn healthy_shared(site: &Site) {
    let cluster = Cluster::start(site, Store::Shared);
    let student = &site.data.students[0];
    let diagnosis = doctor(
        &config(&cluster),
        Some((&student.username, &student.password)),
    );
    diagnosis.healthy();
    let nodes = diagnosis.report["nodes"].as_array().unwrap();
    assert!(
        nodes.iter().filter(|n| n["reached"] == true).count() >= 5,
        "all four nodes and the data server were asked: {nodes:?}"
    );
    nobody_left_logged_in(&cluster, &site.dataroot, &student.username);
}

pub fn healthy_offload(site: &Site) {
    let cluster = Cluster::start_offload(site);
    let student = &site.data.students[1];
    let diagnosis = doctor(
        &config(&cluster),
        Some((&student.username, &student.password)),
    );
    diagnosis.healthy();
    assert!(
        diagnosis.report["unchecked"].as_array().unwrap().is_empty(),
        "with --login the offload was checked end to end: {}",
        diagnosis.report
    );
    nobody_left_logged_in(&cluster, &site.dataroot, &student.username);
}

pub fn another_wwwroot(site: &Site) {
    let elsewhere = format!("http://127.0.0.1:{}", free_port());
    let tweaks = [("web3", "MOODLE_WWWROOT", elsewhere)];
    let cluster = Cluster::start_tweaked(site, Store::Shared, false, WORKERS, &tweaks);
    doctor(&config(&cluster), None).finds(&["web3"], "$CFG->wwwroot");
    // The report for a terminal says the same: the node, the setting, the line.
    let (code, text) = doctor_text(&config(&cluster));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("web3: $CFG->wwwroot"), "{text}");
    assert!(
        text.contains(&format!("$CFG->wwwroot = '{}';", cluster.wwwroot())),
        "{text}"
    );
}

/// `moodle-gateway doctor` without `--json`: exit code and stdout.
fn doctor_text(config: &str) -> (Option<i32>, String) {
    let (code, stdout, _) = run_doctor(config, &[], &[]);
    (code, stdout)
}

pub fn node_local_believed_shared(site: &Site) {
    let cluster = Cluster::start(site, Store::NodeLocal);
    let text = config(&cluster).replace("store = \"node-local\"", "store = \"shared\"");
    assert!(text.contains("store = \"shared\""));
    // Every node but the reference, and the data server, keep their own sessions.
    doctor(&text, None).finds(&["web2", "web3", "web4", "data"], "[session] store");
}

pub fn offload_without_xsendfile(site: &Site) {
    let off = |node| (node, "MOODLE_XSENDFILE", "off".to_string());
    let tweaks = ["web1", "web2", "web3", "web4"].map(off);
    let cluster = Cluster::start_tweaked(site, Store::NodeLocal, true, WORKERS, &tweaks);
    let student = &site.data.students[2];
    let diagnosis = doctor(
        &config(&cluster),
        Some((&student.username, &student.password)),
    );
    diagnosis.finds(&["web1", "web2", "web3", "web4"], "$CFG->xsendfile");
    nobody_left_logged_in(&cluster, &site.dataroot, &student.username);
}

pub fn revisions_apart(site: &Site) {
    let tweaks = [("web2", "MOODLE_THEMEREV", "1700000000".to_string())];
    let cluster = Cluster::start_tweaked(site, Store::Shared, false, WORKERS, &tweaks);
    doctor(&config(&cluster), None).finds(&["web2"], "theme and JavaScript revisions");
}

pub fn https_without_sslproxy(site: &Site) {
    // Students reach https://…: the nodes' wwwroot says so, and none has sslproxy.
    let https = |n| (n, "MOODLE_WWWROOT", "https://{public}".to_string());
    let all = ["web1", "web2", "web3", "web4", "data"].map(https);
    let cluster = Cluster::start_tweaked(site, Store::Shared, false, WORKERS, &all);
    let text = config(&cluster).replace("wwwroot = \"http://", "wwwroot = \"https://");
    doctor(&text, None).finds(&["web1", "web2", "web3", "web4", "data"], "$CFG->sslproxy");
}

pub fn maintenance(site: &Site) {
    let cluster = Cluster::start(site, Store::Shared);
    let file = site.dataroot.join("climaintenance.html");
    std::fs::write(&file, "<h1>Back at noon</h1>").unwrap();
    let diagnosis = doctor(&config(&cluster), None);
    std::fs::remove_file(&file).unwrap();
    diagnosis.finds(
        &["web1", "web2", "web3", "web4", "data"],
        "maintenance mode",
    );
}

/// A low-priority pool whose web server gives PHP its own port (no `fastcgi_param
/// SERVER_PORT`): Moodle redirects everything sent there. And one nothing listens
/// at. The other nodes' pools are right and not named.
pub fn low_pool_on_its_own_port(site: &Site) {
    let tweaks = [("web2", "LOW:MOODLE_OWN_PORT", "1".to_owned())];
    let cluster = Cluster::start_with_low_pools_tweaked(site, WORKERS, &tweaks);
    let web3 = cluster.nodes[2].low.as_ref().unwrap().addr.to_string();
    let nobody = format!("127.0.0.1:{}", free_port());
    let text = with_low_pools(&config(&cluster), &cluster).replace(&web3, &nobody);
    let diagnosis = doctor(&text, None);
    assert_eq!(diagnosis.code, Some(1), "{}", diagnosis.explain());
    let pools: Vec<(String, String)> = (diagnosis.findings().into_iter())
        .filter(|(_, setting)| setting == "low_priority_url")
        .collect();
    let named = ["web2", "web3"].map(|node| (node.to_owned(), "low_priority_url".to_owned()));
    assert_eq!(pools, named, "{}", diagnosis.explain());
    let (_, text) = doctor_text(&text);
    assert!(text.contains("fastcgi_param SERVER_PORT"), "{text}");
    assert!(
        text.contains("remove [[nodes]] web3 low_priority_url"),
        "{text}"
    );
}

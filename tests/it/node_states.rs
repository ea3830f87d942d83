//! An admin's drain or disable on a gateway on its own: kept with the snapshot, so it
//! survives a restart and a crash, while the config file's `state` still wins where
//! an admin edited it meanwhile; and no reload can slip between an admin's check and
//! change.

use std::net::SocketAddr;
use std::time::Duration;

use moodle_gateway::config::NodeState;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::Browser;
use moodle_gateway::sessions::snapshot;
use serde_json::Value;

use crate::support::{self, start_binary, TestGateway};

const TOKEN: &str = "node-states-admin-token-0123456789";

fn config(cluster: &Cluster) -> String {
    cluster.config_toml("127.0.0.1:0", Some(("127.0.0.1:0", TOKEN)), "")
}

async fn admin(addr: SocketAddr, method: &str, path: &str) -> (u16, Value) {
    let url = format!("http://{addr}{path}");
    let auth = format!("Bearer {TOKEN}");
    let seen = support::send(&url, method, &[("authorization", &auth)], "").await;
    let body = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
    (seen.status.as_u16(), body)
}

/// Every node's state as `GET /nodes` shows it, in config order.
async fn states(admin_addr: SocketAddr) -> Vec<(String, String)> {
    let (status, body) = admin(admin_addr, "GET", "/nodes").await;
    assert_eq!(status, 200);
    (body["nodes"].as_array().unwrap().iter())
        .map(|n| {
            (
                n["name"].as_str().unwrap().into(),
                n["state"].as_str().unwrap().into(),
            )
        })
        .collect()
}

fn named(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| ((*a).into(), (*b).into()))
        .collect()
}

/// Waits until the state file on disk says `node` is `state`: the admin's change is
/// saved at once, not at the next `save_every`. A file that records no state for it
/// (no admin change anywhere: written in the older format) says the file's state,
/// `active` here.
async fn saved(file: &std::path::Path, node: &str, state: NodeState) {
    for _ in 0..200 {
        if let Ok(Some(snapshot)) = snapshot::read(file) {
            let found = snapshot.nodes.iter().find(|n| n.name == node);
            let recorded = found.map(|n| n.state.map_or(NodeState::Active, |s| s.now));
            if recorded == Some(state) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{} never recorded {node} as {state}", file.display());
}

/// The nodes new visitors are dealt, `count` of them.
async fn dealt(addr: SocketAddr, count: usize) -> Vec<String> {
    let mut nodes = Vec::new();
    for _ in 0..count {
        let mut visitor = Browser::new(addr, "", "MoodleSession");
        let reply = visitor.get("/login/index.php").await.unwrap();
        assert_eq!(reply.status, 200);
        nodes.push(reply.upstream().to_owned());
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admins_drain_and_disable_survive_a_crash_and_a_restart_unless_the_file_changed_them() {
    let cluster = Cluster::spawn(4, "", "MoodleSession").unwrap();
    let gateway = start_binary(&config(&cluster));
    let file = gateway.dir().join("moodle-gateway.state");
    let admin_addr = gateway.admin_addr.unwrap();
    assert_eq!(admin(admin_addr, "POST", "/nodes/web2/drain").await.0, 200);
    assert_eq!(
        admin(admin_addr, "POST", "/nodes/web3/disable").await.0,
        200
    );
    saved(&file, "web3", NodeState::Disabled).await;

    // Killed: no shutdown save. The drain and the disable were on disk already.
    let gateway = gateway.crash_and_restart();
    let admin_addr = gateway.admin_addr.unwrap();
    let want = [
        ("web1", "active"),
        ("web2", "draining"),
        ("web3", "disabled"),
        ("web4", "active"),
    ];
    assert_eq!(states(admin_addr).await, named(&want));
    let nodes = dealt(gateway.addr, 4).await;
    assert!(
        nodes.iter().all(|n| n == "web1" || n == "web4"),
        "new students go to the active nodes only: {nodes:?}"
    );

    // While it is down, an admin edits web3's state in the file: the newer word wins
    // for web3; web2's drain, which the file never touched, stays.
    let path = gateway.dir().join("config.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let block = cluster.node_toml("web3").unwrap();
    let edited = text.replace(&block, &format!("{block}state = \"draining\"\n"));
    assert_ne!(edited, text);
    std::fs::write(&path, edited).unwrap();
    let gateway = gateway.crash_and_restart();
    let want = [
        ("web1", "active"),
        ("web2", "draining"),
        ("web3", "draining"),
        ("web4", "active"),
    ];
    assert_eq!(states(gateway.admin_addr.unwrap()).await, named(&want));

    // An undrain is kept the same way: web2 is back in the deal after the restart.
    let admin_addr = gateway.admin_addr.unwrap();
    assert_eq!(
        admin(admin_addr, "POST", "/nodes/web2/undrain").await.0,
        200
    );
    saved(&file, "web2", NodeState::Active).await;
    let gateway = gateway.crash_and_restart();
    let admin_addr = gateway.admin_addr.unwrap();
    assert_eq!(
        states(admin_addr).await[1],
        ("web2".into(), "active".into())
    );
    let nodes = dealt(gateway.addr, 3).await;
    assert!(nodes.contains(&"web2".to_owned()), "{nodes:?}");
}

/// A reload copies every node's state into the new generation and tells the store
/// what the file changed. An admin's change in that instant could be checked against
/// states the reload is replacing, or be published before the reload's older word:
/// both hold the same lock, so a reload waits for a change in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_waits_for_an_admins_change_in_progress() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let text = config(&cluster);
    let gateway = TestGateway::start(&text).await;
    let core = gateway.app.gateway().clone();
    let next = moodle_gateway::Config::parse(
        &text.replace(
            &cluster.node_toml("web2").unwrap(),
            &format!(
                "{}state = \"draining\"\n",
                cluster.node_toml("web2").unwrap()
            ),
        ),
        std::path::Path::new("."),
        moodle_gateway::config::ConfigEnv::default(),
    )
    .unwrap();

    let change = core.lock_node_states();
    let reloading = {
        let core = core.clone();
        std::thread::spawn(move || core.apply(&next))
    };
    // However long this pause, a reload that does not wait has finished by its end.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !reloading.is_finished(),
        "the reload went ahead while an admin's change held the lock"
    );
    let before = core.settings().upstreams.by_name("web2").unwrap().state();
    assert_eq!(
        before,
        NodeState::Active,
        "nothing of the reload landed yet"
    );
    drop(change);
    reloading.join().unwrap().unwrap();
    let after = core.settings().upstreams.by_name("web2").unwrap().state();
    assert_eq!(after, NodeState::Draining, "then it applies");
}

//! The gateway itself killed (a crash, the OOM killer, `kill -9`) with node-local
//! sessions, on the shipped config with only its addresses changed: the students who
//! logged in a moment before are still sent to the node that holds their session.
//!
//! Why it is the package's default: the table is saved every `state.save_every`, so
//! a killed gateway forgets the logins since the last save, and a node that holds a
//! session sets no new cookie for it: without the route cookie those students would
//! be dealt afresh and logged out.

use http::Method;
use moodle_gateway::demo::standin::Cluster;
use moodle_gateway::demo::Browser;

use crate::support::start_binary_with_files;

/// The shipped `config.toml` in front of `cluster`, students on `port`, sessions
/// node-local: every other line as the package installs it.
fn shipped_config(cluster: &Cluster, port: u16) -> String {
    let mut config =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap();
    let mut swap = |from: &str, to: String| {
        assert_eq!(
            config.matches(from).count(),
            1,
            "config.toml has one {from}"
        );
        config = config.replace(from, &to);
    };
    swap(
        "listen = \"0.0.0.0:8080\"",
        format!("listen = \"127.0.0.1:{port}\""),
    );
    swap(
        "listen = \"127.0.0.1:9090\"",
        "listen = \"127.0.0.1:0\"".into(),
    );
    swap(
        "wwwroot = \"https://moodle.example.edu\"",
        format!("wwwroot = \"http://127.0.0.1:{port}\""),
    );
    swap(
        "\nstore = \"shared\"\n",
        "\nstore = \"node-local\"\n".into(),
    );
    // The package's spool directory is the unit's; the test's own is in its directory.
    swap(
        "spool_dir = \"/var/cache/moodle-gateway\"",
        "spool_dir = \"spool\"".into(),
    );
    for (i, node) in cluster.nodes().iter().enumerate() {
        swap(
            &format!("url = \"http://192.168.1.{}\"\n", i + 1),
            format!("url = \"http://{}\"\n", node.addr()),
        );
    }
    swap(
        "url = \"http://192.168.1.5\"",
        format!("url = \"http://{}\"", cluster.data().addr()),
    );
    config
}

/// A free loopback port: the gateway's `listen` and `wwwroot` must name the same one,
/// before and after the restart.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A student who logged in: their browser, their node, and the route cookie
/// (`name=value`) the gateway set, if any.
struct Student {
    browser: Browser,
    node: String,
    route: Option<String>,
}

async fn log_in(addr: std::net::SocketAddr, n: usize) -> Student {
    let mut browser = Browser::new(addr, "", "MoodleSession");
    let form = browser.get("/login/index.php").await.unwrap();
    let token = form.text().split_once("logintoken=").unwrap().1[..32].to_owned();
    let body = format!("username=student{n}&password=x&logintoken={token}");
    let done = browser.post("/login/index.php", &body).await.unwrap();
    assert_eq!(done.status, 303, "login: {}", done.text());
    let route = (done.headers.get_all("set-cookie").iter())
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("MoodleGatewayRoute="))
        .map(|v| v.split(';').next().unwrap().to_owned());
    Student {
        browser,
        node: done.upstream().to_owned(),
        route,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_right_after_a_batch_of_logins_keeps_every_student_on_their_node() {
    let cluster = Cluster::spawn(4, "", "MoodleSession").unwrap();
    let port = free_port();
    let files = [
        (
            "admin.token",
            "an-admin-token-for-the-crash-test-0123456789\n",
        ),
        (
            "route.secret",
            "a-route-secret-made-at-install-0123456789abcdef\n",
        ),
    ];
    let gateway = start_binary_with_files(&shipped_config(&cluster, port), &files);
    let mut students = Vec::new();
    for n in 0..8 {
        students.push(log_in(gateway.addr, n).await);
    }
    let nodes: Vec<&str> = students.iter().map(|s| s.node.as_str()).collect();
    assert_eq!(
        nodes,
        ["web1", "web2", "web3", "web4"].repeat(2),
        "dealt in turn"
    );

    // Killed well within save_every (30 s): the last snapshot holds none of them.
    let gateway = gateway.crash_and_restart();
    // In reverse: a fresh deal starting at web1 would put each one elsewhere.
    for (n, student) in students.iter_mut().enumerate().rev() {
        let mut back = Browser::new(gateway.addr, "", "MoodleSession");
        back.set_session(student.browser.session().map(str::to_owned));
        let route = student
            .route
            .as_deref()
            .unwrap_or("MoodleGatewayRoute=none");
        let reply = back
            .send(Method::GET, "/my/", None, &[("cookie", route)])
            .await
            .unwrap();
        assert!(
            reply.status == 200 && reply.upstream() == student.node,
            "student{n}, logged in on {}, got {} from {} after the crash (route cookie: {:?})",
            student.node,
            reply.status,
            reply.upstream(),
            student.route,
        );
    }
    assert_eq!(cluster.lost_sessions(), 0, "nobody was logged out");
}

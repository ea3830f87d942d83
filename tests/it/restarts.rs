//! A node that refuses connections for a moment (Apache or PHP-FPM restarting) with
//! node-local sessions: a student bound to it waits and gets their page from it,
//! slowly, instead of a 502, and stays logged in. A node gone for longer than
//! `failover_hold` is treated as before: a down node, whose students move.
//!
//! Why it is safe: a refused connect means nothing reached the node, so the request
//! (a POST too: its body was never read) can be sent again without running twice.
//! A node that dies mid-request (the connection closed before a byte of answer)
//! gets a GET or HEAD again, once: those change nothing on the node.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request};
use moodle_gateway::demo::standin::{Cluster, StandIn};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::support::{logged_in, TestGateway};

/// Probes every 100 ms that never take a node down (`fall` far above what a 1 s
/// outage counts) and bring it back at once: only the request path is under test.
const PATIENT_HEALTH: &str = "health.interval = \"100ms\"\nhealth.timeout = \"100ms\"\n\
                              health.rise = 1\nhealth.fall = 100\n";

async fn start(cluster: &Cluster, extra: &str) -> TestGateway {
    TestGateway::start(&cluster.config_toml("127.0.0.1:0", None, extra)).await
}

/// Stops `node` and waits until the gateway has noticed that its kept connections
/// to it are closed, so the next request opens a new one (and is refused).
async fn stop(gateway: &TestGateway, node: &StandIn) {
    node.stop();
    for _ in 0..500 {
        if gateway.app.gateway().prune_connections() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the gateway still keeps connections to the stopped node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_student_whose_node_restarts_in_a_second_gets_a_slow_page_from_it_not_a_502() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let extra = format!("{PATIENT_HEALTH}session.failover_hold = \"10s\"\n");
    let gateway = start(&cluster, &extra).await;
    let (student, node) = logged_in(&gateway, 1).await;
    let web = cluster.by_name(&node).unwrap();
    let before = web.requests().len();
    stop(&gateway, web).await;

    let (mut page, mut post) = (student.clone(), student.clone());
    let page = tokio::spawn(async move { page.get("/my/").await.unwrap() });
    let form = "cmi.core.lesson_status=completed";
    let post = tokio::spawn(async move { post.post("/mod/scorm/datamodel.php", form).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    web.restart().unwrap();

    let page = page.await.unwrap();
    assert_eq!(
        (page.status.as_u16(), page.upstream()),
        (200, node.as_str())
    );
    assert_eq!(page.issued, None, "no new session");
    let post = post.await.unwrap().unwrap();
    assert_eq!(
        (post.status.as_u16(), post.text()),
        (200, "true".to_owned())
    );
    assert_eq!(post.upstream(), node, "the POST waited for its node too");
    // The POST reached the node once, whole.
    let posts: Vec<_> = web.requests()[before..]
        .iter()
        .filter(|r| r.method == Method::POST)
        .map(|r| (r.uri.path().to_owned(), r.body_len))
        .collect();
    assert_eq!(posts, [("/mod/scorm/datamodel.php".to_owned(), form.len())]);
    assert_eq!(cluster.lost_sessions(), 0, "the student is still logged in");
    let mut student = student;
    assert_eq!(student.get("/my/").await.unwrap().upstream(), node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_stays_closed_past_the_hold_is_down_and_its_student_moves() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    // No probe during the test: the student's own refused tries count towards
    // `fall` and take the node down.
    let extra = "health.interval = \"1h\"\nhealth.fall = 2\nsession.failover_hold = \"1s\"\n";
    let gateway = start(&cluster, extra).await;
    let (mut student, node) = logged_in(&gateway, 1).await;
    stop(&gateway, cluster.by_name(&node).unwrap()).await;

    let reply = student.get("/my/").await.unwrap();
    assert_ne!(reply.upstream(), node, "re-dealt after the hold");
    assert!(
        !reply.upstream().is_empty(),
        "answered by a node: {reply:?}"
    );
    assert!(
        reply.sent_to_login(),
        "a node-local session is gone: log in again"
    );
    let settings = gateway.app.gateway().settings();
    let web = settings.upstreams.by_name(&node).unwrap();
    assert!(!web.health.is_up(), "its refusals took the node down");
}

type Log = Arc<Mutex<Vec<String>>>;

/// A node that dies mid-request, as PHP-FPM does when it is restarted or crashes:
/// it answers every request itself (`ok`, and a session cookie to the login page),
/// except that for each [`arm`](Dying::arm) it reads the head of the next request
/// for `/course/view.php` and closes the connection without a byte of answer.
struct Dying {
    addr: std::net::SocketAddr,
    armed: Arc<AtomicUsize>,
    /// `METHOD path` of every request it read, in order (probes left out).
    seen: Arc<Mutex<Vec<String>>>,
    /// The `X-Forwarded-*`, `User-Agent` and `Accept-Language` lines of each request
    /// for `/course/view.php`, in order (empty if none).
    chains: Arc<Mutex<Vec<String>>>,
}

impl Dying {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (armed, seen, chains) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::default(),
            Arc::default(),
        );
        let node = Self {
            addr,
            armed: armed.clone(),
            seen: Arc::clone(&seen),
            chains: Arc::clone(&chains),
        };
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let log = (Arc::clone(&seen), Arc::clone(&chains));
                tokio::spawn(Self::serve(socket, armed.clone(), log));
            }
        });
        node
    }

    fn arm(&self, times: usize) {
        self.armed.fetch_add(times, Ordering::SeqCst);
    }

    fn seen(&self, what: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| *s == what)
            .count()
    }

    fn chains(&self) -> Vec<String> {
        self.chains.lock().unwrap().clone()
    }

    async fn serve(socket: TcpStream, armed: Arc<AtomicUsize>, log: (Log, Log)) {
        let (seen, chains) = log;
        let (read, mut write) = socket.into_split();
        let mut read = BufReader::new(read);
        loop {
            let mut line = String::new();
            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let mut parts = line.split_whitespace();
            let (method, target) = (
                parts.next().unwrap_or("").to_owned(),
                parts.next().unwrap_or(""),
            );
            let path = target.split('?').next().unwrap_or("").to_owned();
            let (mut length, mut chain) = (0, String::new());
            loop {
                let mut header = String::new();
                read.read_line(&mut header).await.unwrap();
                if header == "\r\n" {
                    break;
                }
                let lower = header.to_ascii_lowercase();
                if let Some(value) = lower.strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap();
                }
                // Every line kept: a second one would show as ` | ` in the chain.
                let noted = ["x-forwarded-", "user-agent: ", "accept-language: "];
                if noted.iter().any(|name| lower.starts_with(name)) {
                    if !chain.is_empty() {
                        chain.push_str(" | ");
                    }
                    chain.push_str(lower.strip_prefix("x-forwarded-").unwrap_or(&lower).trim());
                }
            }
            let mut body = vec![0; length];
            read.read_exact(&mut body).await.unwrap();
            if path.starts_with("/theme/") {
                // A health probe: always answered.
            } else {
                seen.lock().unwrap().push(format!("{method} {path}"));
                if path == "/course/view.php" {
                    chains.lock().unwrap().push(chain);
                }
                let dies = path == "/course/view.php"
                    && armed
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                if dies {
                    return;
                }
            }
            let cookie = match path.as_str() {
                "/login/index.php" => {
                    "Set-Cookie: MoodleSession=d1e2f3g4h5i6j7k8l9m0n1o2p3; path=/\r\n"
                }
                _ => "",
            };
            let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n{cookie}\r\nok");
            if write.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// A student's GET whose node closed the connection before answering is sent again
/// to the same node, once: a page, slowly, not a 502. A POST never is (it may have
/// changed something), nor a GET carrying Moodle's `sesskey` (a link that acts), and a
/// node that closes the same GET twice gets no third try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_whose_node_dies_before_answering_is_sent_again_and_a_post_is_not() {
    let node = Dying::start().await;
    let data = crate::support::named_upstream("data").await;
    let text = format!(
        "listen = \"127.0.0.1:0\"\n{PATIENT_HEALTH}session.failover_hold = \"5s\"\n\
         [[nodes]]\nname = \"web1\"\nurl = \"http://{}\"\n[data]\nname = \"data\"\nurl = \"http://{data}\"\n",
        node.addr
    );
    let gateway = TestGateway::start(&text).await;
    let client = crate::support::client();
    let send = |method: &str, path: &str| {
        let request = Request::builder()
            .method(method)
            .uri(gateway.url(path))
            .header("cookie", "MoodleSession=d1e2f3g4h5i6j7k8l9m0n1o2p3")
            .body(axum::body::Body::from(if method == "POST" {
                "a=1"
            } else {
                ""
            }))
            .unwrap();
        client.request(request)
    };
    let login = crate::support::get(&gateway.url("/login/index.php")).await;
    assert_eq!(login.status, 200);

    node.arm(1);
    let page = send("GET", "/course/view.php?id=2").await.unwrap();
    assert_eq!(page.status(), 200, "the GET went again and got its page");
    assert_eq!(node.seen("GET /course/view.php"), 2);

    node.arm(1);
    let post = send("POST", "/course/view.php?id=2").await.unwrap();
    assert_eq!(post.status(), 502, "a POST is never sent twice");
    assert_eq!(node.seen("POST /course/view.php"), 1);

    // A GET that acts (a sesskey link: a toggle, a logout) may have acted already.
    node.arm(1);
    let toggle = send("GET", "/course/view.php?id=2&sesskey=Xy12")
        .await
        .unwrap();
    assert_eq!(toggle.status(), 502, "a sesskey link is never sent twice");
    assert_eq!(node.seen("GET /course/view.php"), 3);

    node.arm(2);
    let page = send("GET", "/course/view.php?id=3").await.unwrap();
    assert_eq!(
        page.status(),
        502,
        "closed on twice: the node fails on this page"
    );
    assert_eq!(
        node.seen("GET /course/view.php"),
        5,
        "two more tries, not three"
    );
}

/// Behind a trusted proxy, a GET sent again carries the chain it carried the first
/// time: the gateway's hop is added once, not once per try (Moodle's
/// `getremoteaddr()` and its logs would see the gateway as the student otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_sent_again_behind_a_trusted_proxy_names_the_student_once() {
    let trusted = "trusted_proxies = [\"127.0.0.1/32\"]\n";
    let (node, gateway) = sent_again(trusted, &[("x-forwarded-for", "198.51.100.23")]).await;
    let host = gateway.addr.to_string();
    let chain = format!("for: 198.51.100.23, 127.0.0.1 | proto: http | host: {host}");
    assert_eq!(
        node.chains(),
        [chain.clone(), chain],
        "both tries name the student once, with one of each forwarding line"
    );
}

/// A GET sent again carries the lines a browser sends of itself, which pass the
/// gateway's header map by: once each, both times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_sent_again_carries_the_browsers_own_lines_each_time() {
    let browser = [
        ("user-agent", "Firefox/128.0"),
        ("accept-language", "pt-PT"),
    ];
    let (node, gateway) = sent_again("", &browser).await;
    let host = format!("host: {}", gateway.addr);
    let browser = ["accept-language: pt-pt", "user-agent: firefox/128.0"];
    let mut lines = vec!["for: 127.0.0.1", "proto: http", &host];
    lines.extend(browser);
    lines.sort_unstable();
    // Lines of different names may go in any order.
    let tries: Vec<Vec<String>> = (node.chains().iter())
        .map(|chain| {
            let mut tried: Vec<String> = chain.split(" | ").map(str::to_owned).collect();
            tried.sort_unstable();
            tried
        })
        .collect();
    assert_eq!(tries, [lines.clone(), lines], "both tries, once each");
}

/// A student's GET, with `headers`, through a gateway (`extra` config lines) to a
/// node that closes the first try without answering: the page must come from the
/// second try.
async fn sent_again(extra: &str, headers: &[(&str, &str)]) -> (Dying, TestGateway) {
    let node = Dying::start().await;
    let data = crate::support::named_upstream("data").await;
    let text = format!(
        "listen = \"127.0.0.1:0\"\n{extra}{PATIENT_HEALTH}\
         [[nodes]]\nname = \"web1\"\nurl = \"http://{}\"\n[data]\nname = \"data\"\nurl = \"http://{data}\"\n",
        node.addr
    );
    let gateway = TestGateway::start(&text).await;
    let login = crate::support::get(&gateway.url("/login/index.php")).await;
    assert_eq!(login.status, 200);
    node.arm(1);
    let mut request = Request::get(gateway.url("/course/view.php?id=2"))
        .header("cookie", "MoodleSession=d1e2f3g4h5i6j7k8l9m0n1o2p3");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(axum::body::Body::empty()).unwrap();
    let page = crate::support::client().request(request).await.unwrap();
    assert_eq!(page.status(), 200, "the GET went again and got its page");
    (node, gateway)
}

/// The data server restarting its web server for a second (a refused connect while
/// it is still up) is waited out like a node's: the SCORM file comes, slowly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scorm_file_whose_data_server_restarts_in_a_second_is_a_slow_file_not_a_502() {
    let cluster = Cluster::spawn(1, "", "MoodleSession").unwrap();
    let extra =
        format!("{PATIENT_HEALTH}session.store = \"shared\"\nsession.failover_hold = \"10s\"\n");
    let gateway = start(&cluster, &extra).await;
    let (mut student, _) = logged_in(&gateway, 1).await;
    let file = "/pluginfile.php/5/mod_scorm/content/1/index.html";
    assert_eq!(student.get(file).await.unwrap().upstream(), "data");
    stop(&gateway, cluster.data()).await;

    let fetch = tokio::spawn(async move { student.get(file).await.unwrap() });
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.data().restart().unwrap();
    let reply = fetch.await.unwrap();
    assert_eq!((reply.status.as_u16(), reply.upstream()), (200, "data"));
}

/// A new visitor's form post whose first node refuses the connection goes to the
/// next node: its body is whole in the gateway's memory, none of it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_visitors_small_post_refused_by_its_node_goes_to_the_next() {
    let cluster = Cluster::spawn(2, "", "MoodleSession").unwrap();
    let gateway = start(&cluster, PATIENT_HEALTH).await;
    stop(&gateway, cluster.by_name("web1").unwrap()).await;
    let form = "username=student1&password=x";
    let mut visitor = moodle_gateway::demo::Browser::new(gateway.addr, "", "MoodleSession");
    let reply = visitor.post("/login/index.php", form).await.unwrap();
    assert_ne!(reply.status.as_u16(), 502, "{reply:?}");
    assert_eq!(reply.upstream(), "web2");
    let web2 = cluster.by_name("web2").unwrap();
    let posts: Vec<_> = (web2.requests().iter())
        .filter(|r| r.method == Method::POST)
        .map(|r| r.body_len)
        .collect();
    assert_eq!(posts, [form.len()], "the whole body, once");
}

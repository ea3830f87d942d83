//! Hostile input at the public listener: raw bytes that no polite client would send,
//! each one line of a table saying what the student gets back, whether the gateway
//! hangs up, and how many requests the node behind it saw.
//!
//! Why the node count matters as much as the status: a request-smuggling bug is an
//! answer to the client that looks fine while the node read a different request
//! than the gateway did. So every case also checks, through the admin API, that bad
//! input never counts against the node's health, and that nothing named
//! `/smuggled.php` ever reached it.

use std::time::Duration;

use serde_json::Value;

use crate::support::{
    self, config_for, named_upstream, AfterwardsRaw, RawConn, RawResponse, Received, TestGateway,
};

const TOKEN: &str = "bad-input-admin-token-0123456789";
const HOST: &str = "moodle.example.edu";
/// How long a response may take; generous, the machine is shared.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// How soon a connection the gateway should close must be closed.
const CLOSED_WITHIN: Duration = Duration::from_secs(1);

/// The config a case runs under; every one has the admin API (to read health) and
/// `health.fall = 1`, so a single request counted against the node would show.
#[derive(Debug, Clone, Copy)]
enum Setup {
    Plain,
    /// `site.hosts = ["moodle.example.edu"]`.
    Hosts,
    /// `limits.max_body_bytes = "1KiB"`.
    SmallBody,
}

impl Setup {
    fn extra(self) -> String {
        let mut extra =
            format!("admin.listen = \"127.0.0.1:0\"\nadmin.token = \"{TOKEN}\"\nhealth.fall = 1\n");
        match self {
            Setup::Plain => {}
            Setup::Hosts => extra.push_str(&format!("site.hosts = [\"{HOST}\"]\n")),
            Setup::SmallBody => extra.push_str("limits.max_body_bytes = \"1KiB\"\n"),
        }
        extra
    }
}

/// What one case produced.
struct Outcome {
    responses: Vec<RawResponse>,
    afterwards: AfterwardsRaw,
    received: Vec<Received>,
    health: String,
}

type Check = fn(&Outcome) -> Result<(), String>;

/// One line of the table.
struct Case {
    name: &'static str,
    setup: Setup,
    bytes: Vec<u8>,
    /// One entry per response expected, each the statuses the spec allows.
    answers: Vec<&'static [u16]>,
    closed: Option<bool>,
    node: Option<usize>,
    check: Option<Check>,
}

fn case(name: &'static str, bytes: impl Into<Vec<u8>>) -> Case {
    Case {
        name,
        setup: Setup::Plain,
        bytes: bytes.into(),
        answers: Vec::new(),
        closed: None,
        node: None,
        check: None,
    }
}

impl Case {
    fn under(mut self, setup: Setup) -> Self {
        self.setup = setup;
        self
    }
    /// The next response's status is one of `statuses`.
    fn answers(mut self, statuses: &'static [u16]) -> Self {
        self.answers.push(statuses);
        self
    }
    /// 400 and the connection closed, the node untouched: the usual refusal.
    fn refused(self) -> Self {
        self.answers(&[400]).closed().node(0)
    }
    fn closed(mut self) -> Self {
        self.closed = Some(true);
        self
    }
    fn open(mut self) -> Self {
        self.closed = Some(false);
        self
    }
    fn node(mut self, count: usize) -> Self {
        self.node = Some(count);
        self
    }
    fn check(mut self, check: Check) -> Self {
        self.check = Some(check);
        self
    }
}

/// `GET {target}` with a normal Host and `extra` header lines (each ending `\r\n`).
fn get(target: &str, extra: &str) -> String {
    format!("GET {target} HTTP/1.1\r\nHost: {HOST}\r\n{extra}\r\n")
}

/// A POST head to the forum with `extra` header lines, then `body` as is.
fn post(extra: &str, body: &str) -> String {
    format!("POST /mod/forum/post.php HTTP/1.1\r\nHost: {HOST}\r\n{extra}\r\n{body}")
}

/// A second request hidden where a body would be.
const SMUGGLED: &str = "GET /smuggled.php HTTP/1.1\r\nHost: moodle.example.edu\r\n\r\n";

fn framing_cases() -> Vec<Case> {
    let cl_te_smuggle = format!("0\r\n\r\n{SMUGGLED}");
    let te_cl_smuggle = format!("{:x}\r\n{SMUGGLED}\r\n0\r\n\r\n", SMUGGLED.len());
    vec![
        // Both framings at once: refused with 400 and closed (RFC 9112 6.1 allows a
        // server to reject it), so the node never sees any of it.
        case("CL then TE", post("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n")).refused(),
        case("TE then CL", post("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "0\r\n\r\n")).refused(),
        case("CL.TE smuggling a request in the body", post(&format!("Content-Length: {}\r\nTransfer-Encoding: chunked\r\n", cl_te_smuggle.len()), &cl_te_smuggle)).refused(),
        case("TE.CL smuggling a request in a chunk", post("Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", &te_cl_smuggle)).refused(),
        case("CL, Expect and TE", post("Content-Length: 5\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n")).refused(),
        // A 4xx that says nothing against the framing keeps the connection on both
        // parsers: the unread body is read away and the next request answered.
        case("a refused POST with a length, then a GET", format!("POST /mod/forum/post.php HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 5\r\n\r\nhello{}", get("/course/view.php?id=1", ""))).under(Setup::Hosts).answers(&[421]).answers(&[200]).open().node(1),
        case("a refused chunked POST, then a GET", format!("POST /mod/forum/post.php HTTP/1.1\r\nHost: evil.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n{}", get("/course/view.php?id=1", ""))).under(Setup::Hosts).answers(&[421]).answers(&[200]).open().node(1),
        case("two different Content-Lengths", post("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!")).refused(),
        case("Content-Length -1", post("Content-Length: -1\r\n", "")).refused(),
        case("Content-Length +5", post("Content-Length: +5\r\n", "hello")).refused(),
        case("Content-Length 0x10", post("Content-Length: 0x10\r\n", "0123456789abcdef")).refused(),
        case("Content-Length '5 5'", post("Content-Length: 5 5\r\n", "hello")).refused(),
        case("Content-Length empty", post("Content-Length: \r\n", "")).refused(),
        case("TE xchunked", post("Transfer-Encoding: xchunked\r\n", "5\r\nhello\r\n0\r\n\r\n")).answers(&[400, 501]).closed().node(0),
        case("TE 'chunked, identity'", post("Transfer-Encoding: chunked, identity\r\n", "5\r\nhello\r\n0\r\n\r\n")).answers(&[400, 501]).closed().node(0),
        case("TE identity", post("Transfer-Encoding: identity\r\n", "hello")).answers(&[400, 501]).closed().node(0),
        case("TE 'gzip, chunked'", post("Transfer-Encoding: gzip, chunked\r\n", "5\r\nhello\r\n0\r\n\r\n")).refused(),
        case("TE gzip and chunked on two lines", post("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n")).refused(),
        case("TE 'chunked, chunked'", post("Transfer-Encoding: chunked, chunked\r\n", "5\r\nhello\r\n0\r\n\r\n")).answers(&[400, 501]).closed().node(0),
        case("TE value after a vertical tab", post("Transfer-Encoding:\x0bchunked\r\n", "5\r\nhello\r\n0\r\n\r\n")).answers(&[400, 501]).closed().node(0),
        case("TE folded onto a tab-led line", post("X-Note: a\r\n\tTransfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n")).refused(),
        case("space before the TE colon", post("Transfer-Encoding : chunked\r\n", "5\r\nhello\r\n0\r\n\r\n")).refused(),
        case("TE on HTTP/1.0", format!("POST /mod/forum/post.php HTTP/1.0\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")).refused(),
        case("obs-fold continuation line", get("/course/view.php?id=1", "X-Note: a\r\n b\r\n")).refused(),
        case("bare LF line endings", format!("GET /course/view.php?id=1 HTTP/1.1\nHost: {HOST}\n\n")).answers(&[400, 200]).check(bare_lf_is_refused_or_served_once),
        case("chunk size zz", post("Transfer-Encoding: chunked\r\n", "zz\r\nhello\r\n0\r\n\r\n")).answers(&[400]).closed(),
        case("chunk size negative", post("Transfer-Encoding: chunked\r\n", "-5\r\nhello\r\n0\r\n\r\n")).answers(&[400]).closed(),
        case("chunk size huge", post("Transfer-Encoding: chunked\r\n", "ffffffffffffffffff\r\nhello\r\n0\r\n\r\n")).answers(&[400]).closed(),
        case("no CRLF after chunk data", post("Transfer-Encoding: chunked\r\n", "5\r\nhelloXX0\r\n\r\n")).answers(&[400]).closed(),
        case("body over max_body_bytes by Content-Length", post("Content-Length: 2048\r\n", "")).under(Setup::SmallBody).answers(&[413]).closed().node(0),
        case("chunked body over max_body_bytes", post("Transfer-Encoding: chunked\r\n", &format!("800\r\n{}\r\n0\r\n\r\n", "a".repeat(2048)))).under(Setup::SmallBody).answers(&[413]),
        case("two requests pipelined in one write", format!("{}{}", get("/course/view.php?id=1", ""), get("/course/view.php?id=2", ""))).answers(&[200]).answers(&[200]).open().node(2).check(pipelined_in_order),
    ]
}

fn header_cases() -> Vec<Case> {
    let many: String = (0..101).map(|i| format!("X-H{i}: {i}\r\n")).collect();
    let huge = format!("X-Huge: {}\r\n", "a".repeat(33 * 1024));
    // A line a browser sends of itself, which goes to the node around the map.
    let huge_agent = format!("User-Agent: {}\r\n", "a".repeat(33 * 1024));
    vec![
        case(
            "no Host on HTTP/1.1",
            "GET /course/view.php?id=1 HTTP/1.1\r\n\r\n",
        )
        .refused(),
        case(
            "two Host headers",
            get("/course/view.php?id=1", "Host: other.example\r\n"),
        )
        .refused(),
        case(
            "empty Host",
            "GET /course/view.php?id=1 HTTP/1.1\r\nHost:\r\n\r\n",
        )
        .refused(),
        case(
            "Host with port 99999",
            "GET /course/view.php?id=1 HTTP/1.1\r\nHost: moodle.example.edu:99999\r\n\r\n",
        )
        .refused(),
        case(
            "Host with an empty port",
            "GET /course/view.php?id=1 HTTP/1.1\r\nHost: moodle.example.edu:\r\n\r\n",
        )
        .refused(),
        case(
            "Forwarded from an untrusted client",
            get(
                "/course/view.php?id=1",
                "Forwarded: for=10.0.0.1;proto=https;host=evil.example\r\n",
            ),
        )
        .answers(&[200])
        .open()
        .node(1)
        .check(no_forwarded_header_reached_the_node),
        case(
            "Host not in site.hosts",
            "GET /course/view.php?id=1 HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        )
        .under(Setup::Hosts)
        .answers(&[421])
        .node(0),
        case(
            "Host in site.hosts, other case",
            "GET /course/view.php?id=1 HTTP/1.1\r\nHost: MOODLE.example.edu\r\n\r\n",
        )
        .under(Setup::Hosts)
        .answers(&[200])
        .open()
        .node(1),
        case(
            "one header making the head over 32 KiB",
            get("/course/view.php?id=1", &huge),
        )
        .answers(&[431])
        .closed()
        .node(0),
        case(
            "one User-Agent making the head over 32 KiB",
            get("/course/view.php?id=1", &huge_agent),
        )
        .answers(&[431])
        .closed()
        .node(0),
        case("101 header lines", get("/course/view.php?id=1", &many))
            .answers(&[431])
            .closed()
            .node(0),
        case(
            "underscore header names",
            get(
                "/course/view.php?id=1",
                "X_Forwarded_For: 1.2.3.4\r\nClient_IP: 1.2.3.4\r\n",
            ),
        )
        .answers(&[200])
        .open()
        .node(1)
        .check(no_underscore_header_reached_the_node),
        case(
            "NUL in a header value",
            get("/course/view.php?id=1", "X-Note: a\0b\r\n"),
        )
        .refused(),
    ]
}

fn target_cases() -> Vec<Case> {
    vec![
        case(
            "URI of 9 KiB",
            get(&format!("/course/view.php?q={}", "a".repeat(9 * 1024)), ""),
        )
        .answers(&[414])
        .closed()
        .node(0),
        case(
            "URI of 7 KiB",
            get(&format!("/course/view.php?q={}", "a".repeat(7 * 1024)), ""),
        )
        .answers(&[200])
        .open()
        .node(1),
        case("NUL in the path", get("/course/vi\0ew.php", "")).refused(),
        case("0x01 in the request line", get("/course/vi\x01ew.php", "")).refused(),
        case("0x7f in the request line", get("/course/vi\x7few.php", "")).refused(),
        case(
            "absolute-form with the same Host",
            get(&format!("http://{HOST}/course/view.php"), ""),
        )
        .answers(&[200])
        .open()
        .node(1)
        .check(absolute_form_reaches_the_node_in_origin_form),
        case(
            "absolute-form with another Host",
            format!("GET http://evil.example/course/view.php HTTP/1.1\r\nHost: {HOST}\r\n\r\n"),
        )
        .refused(),
        case(
            "OPTIONS *",
            format!("OPTIONS * HTTP/1.1\r\nHost: {HOST}\r\n\r\n"),
        )
        .answers(&[400])
        .node(0),
        case(
            "CONNECT",
            format!("CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n"),
        )
        .answers(&[405])
        .node(0),
        case("request line garbage", "HELLO\r\n\r\n")
            .answers(&[400, 405])
            .closed()
            .node(0),
        case("HTTP/0.9 request", "GET /\r\n\r\n")
            .answers(&[400, 405])
            .closed()
            .node(0),
        case(
            "HTTP/2.0 on an HTTP/1 connection",
            format!("GET / HTTP/2.0\r\nHost: {HOST}\r\n\r\n"),
        )
        .answers(&[505])
        .closed()
        .node(0),
        case(
            "HTTP/1.2",
            format!("GET / HTTP/1.2\r\nHost: {HOST}\r\n\r\n"),
        )
        .answers(&[505])
        .closed()
        .node(0),
        case(
            "HTTP/2 preface without h2c",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        )
        .answers(&[505])
        .closed()
        .node(0)
        .check(says_http2_is_over_tls),
        case(
            "URI of 66 KiB",
            get(&format!("/course/view.php?q={}", "a".repeat(66 * 1024)), ""),
        )
        .answers(&[414])
        .closed()
        .node(0),
        case(
            "absolute-form with an empty path",
            get(&format!("http://{HOST}?x=1"), ""),
        )
        .answers(&[200])
        .open()
        .node(1)
        .check(an_empty_path_reaches_the_node_as_slash),
        case(
            "lowercase method",
            format!("get /course/view.php?id=1 HTTP/1.1\r\nHost: {HOST}\r\n\r\n"),
        )
        .answers(&[400, 405])
        .node(0),
    ]
}

fn says_http2_is_over_tls(outcome: &Outcome) -> Result<(), String> {
    let body = outcome
        .responses
        .first()
        .map(|r| String::from_utf8_lossy(&r.body));
    match body {
        Some(body) if body.contains("HTTP/2 is offered over TLS") => Ok(()),
        other => Err(format!("the answer said {other:?}")),
    }
}

fn an_empty_path_reaches_the_node_as_slash(outcome: &Outcome) -> Result<(), String> {
    match outcome.received.as_slice() {
        [seen] if seen.uri == "/?x=1" => Ok(()),
        other => Err(format!("the node saw {other:?}")),
    }
}

fn bare_lf_is_refused_or_served_once(outcome: &Outcome) -> Result<(), String> {
    let status = outcome.responses.first().map_or(0, |r| r.status);
    match (status, outcome.received.as_slice()) {
        (400, []) => Ok(()),
        (200, [one]) if one.uri == "/course/view.php?id=1" && one.method == "GET" => Ok(()),
        (status, seen) => Err(format!("status {status} with the node seeing {seen:?}")),
    }
}

fn pipelined_in_order(outcome: &Outcome) -> Result<(), String> {
    let uris: Vec<&str> = outcome.received.iter().map(|r| r.uri.as_str()).collect();
    match uris.as_slice() {
        ["/course/view.php?id=1", "/course/view.php?id=2"] => Ok(()),
        other => Err(format!("the node saw {other:?}")),
    }
}

fn no_underscore_header_reached_the_node(outcome: &Outcome) -> Result<(), String> {
    let names: Vec<&str> = outcome
        .received
        .iter()
        .flat_map(|r| &r.headers)
        .map(|(n, _)| n.as_str())
        .collect();
    if names.iter().any(|n| n.contains('_')) {
        Err(format!("the node received headers {names:?}"))
    } else {
        Ok(())
    }
}

fn no_forwarded_header_reached_the_node(outcome: &Outcome) -> Result<(), String> {
    let forwarded = outcome
        .received
        .iter()
        .flat_map(|r| &r.headers)
        .find(|(n, _)| n == "forwarded");
    match forwarded {
        Some((_, value)) => Err(format!("the node received Forwarded: {value}")),
        None => Ok(()),
    }
}

fn absolute_form_reaches_the_node_in_origin_form(outcome: &Outcome) -> Result<(), String> {
    let [seen] = outcome.received.as_slice() else {
        return Err(format!("the node saw {:?}", outcome.received));
    };
    let host = seen
        .headers
        .iter()
        .find(|(n, _)| n == "host")
        .map(|(_, v)| v.as_str());
    match (seen.uri.as_str(), host) {
        ("/course/view.php", Some(HOST)) => Ok(()),
        (uri, host) => Err(format!("the node saw {uri} with Host {host:?}")),
    }
}

/// Plays one case against a fresh gateway and node.
async fn play(case: &Case) -> Result<Outcome, String> {
    let (node, record) = support::recording_upstream().await;
    let data = named_upstream("data").await;
    let gateway = TestGateway::start(&config_for(&[node], data, &case.setup.extra())).await;
    let mut conn = RawConn::connect(gateway.addr).await;
    // The gateway may refuse and hang up before reading everything: not an error.
    let _ = conn.send(&case.bytes).await;
    let mut responses = Vec::new();
    for _ in &case.answers {
        match conn.response(ANSWER_WITHIN, false).await {
            Ok(response) => responses.push(response),
            Err(error) => return Err(format!("response {}: {error}", responses.len() + 1)),
        }
    }
    let afterwards = conn.afterwards(CLOSED_WITHIN).await;
    let received = record.lock().unwrap().clone();
    let health = node_health(&gateway).await;
    gateway.shutdown().await;
    Ok(Outcome {
        responses,
        afterwards,
        received,
        health,
    })
}

async fn node_health(gateway: &TestGateway) -> String {
    let url = format!("http://{}/nodes", gateway.admin_addr.unwrap());
    let auth = format!("Bearer {TOKEN}");
    let seen = support::send(&url, "GET", &[("authorization", &auth)], "").await;
    let nodes: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
    nodes["nodes"][0]["health"]
        .as_str()
        .unwrap_or("?")
        .to_owned()
}

/// Every way `outcome` differs from what `case` expects, with what happened.
fn judge(case: &Case, outcome: &Outcome) -> Result<String, String> {
    let statuses: Vec<u16> = outcome.responses.iter().map(|r| r.status).collect();
    let mut wrong = Vec::new();
    for (got, allowed) in statuses.iter().zip(&case.answers) {
        if !allowed.contains(got) {
            wrong.push(format!("status {got}, expected one of {allowed:?}"));
        }
    }
    match (&outcome.afterwards, case.closed) {
        (AfterwardsRaw::Extra(extra), _) => {
            wrong.push(format!("unasked-for bytes after the answer: {extra:?}"))
        }
        (AfterwardsRaw::Open, Some(true)) => wrong.push("connection left open".into()),
        (AfterwardsRaw::Closed, Some(false)) => wrong.push("connection closed".into()),
        _ => {}
    }
    let count = outcome.received.len();
    if case.node.is_some_and(|n| n != count) {
        wrong.push(format!(
            "node saw {count} requests, expected {}",
            case.node.unwrap()
        ));
    }
    if outcome.received.iter().any(|r| r.uri.contains("smuggled")) {
        wrong.push("the smuggled request reached the node".into());
    }
    if outcome.health != "up" {
        wrong.push(format!("node health {}", outcome.health));
    }
    if let Some(Err(error)) = case.check.map(|check| check(outcome)) {
        wrong.push(error);
    }
    let seen = format!(
        "statuses {statuses:?}, {:?}, node {count}",
        outcome.afterwards
    );
    if wrong.is_empty() {
        Ok(seen)
    } else {
        Err(format!("{} ({seen})", wrong.join("; ")))
    }
}

/// Plays every case (a few at a time), prints the table, and fails listing every
/// case that did not do what the spec says.
async fn run(cases: Vec<Case>) {
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(6));
    let mut playing = Vec::new();
    for case in cases {
        let limit = limit.clone();
        let name = case.name;
        playing.push((
            name,
            tokio::spawn(async move {
                let _turn = limit.acquire().await.unwrap();
                let verdict = match play(&case).await {
                    Ok(outcome) => judge(&case, &outcome),
                    Err(error) => Err(error),
                };
                verdict
            }),
        ));
    }
    let mut failures = Vec::new();
    for (name, task) in playing {
        let verdict = match task.await {
            Ok(done) => done,
            Err(panic) => Err(format!("panicked: {panic}")),
        };
        match verdict {
            Ok(seen) => println!("PASS  {name}: {seen}"),
            Err(why) => {
                println!("FAIL  {name}: {why}");
                failures.push(format!("{name}: {why}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_framing_that_two_parsers_could_read_differently_is_refused() {
    run(framing_cases()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_that_could_mislead_moodle_are_refused_or_removed() {
    run(header_cases()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_targets_outside_what_a_browser_sends_are_refused() {
    run(target_cases()).await;
}

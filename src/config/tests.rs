//! Unit tests for `config`: every message, key and line number an admin can see,
//! pinned here so the parser can change shape without changing what it reports.

use super::*;

mod acme;
mod edge;
mod operations;
mod site;
mod store;
mod surge;
mod tls;

const NODES: &str = "[[nodes]]\nname = \"web1\"\nurl = \"http://192.168.1.1\"\n";
const DATA: &str = "[data]\nname = \"data\"\nurl = \"http://192.168.1.5\"\n";

/// `env` is the admin token's environment variable.
fn parse(text: &str, env: Option<&str>) -> Result<Config, ConfigErrors> {
    let env = ConfigEnv {
        admin_token: env.map(String::from),
        route_secret: None,
        store_secret: None,
        store_master_password: None,
        store_sentinel_password: None,
    };
    Config::parse(text, Path::new("/nonexistent"), env)
}

/// The errors for `text`, one `<line>: <key>: <message>` per line.
fn errors(text: &str) -> String {
    let errors = parse(text, None).expect_err("config should be rejected").0;
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_minimal_config_gets_every_default() {
    let c = parse(&format!("{NODES}{DATA}"), None).unwrap();
    assert_eq!(
        c.describe(),
        r#"public listener: 0.0.0.0:8080
tls: off (plain HTTP)
admin listener: none (no [admin] section)
trusted proxies: none (X-Forwarded-For from clients is replaced)
site path: / (Moodle at the host root)
site hosts: any (every Host header is passed on)
session cookie: MoodleSession (path /)
balance: round-robin
slow start: a node back from down, draining or disabled gets a tenth of its share of new sessions, rising to all of it over 1m
sessions: at most 1000000; forgotten after 8h 30m idle when logged in, 1h when anonymous
timeouts: connect 5s, response headers 1m, upstream idle 4s, request headers 10s, client keep-alive 1m 15s, body idle 1m, tunnel idle 1h, uploads at least 1KiB/s over 1m and 2h in all
limits: request head 32KiB and 100 header lines (431 beyond), URI 8KiB (414 beyond), body 2GiB (413 beyond), read whole before a node is contacted up to 64KiB, on disk up to 64MiB (4GiB at once, in moodle-gateway.spool); 10000 connections and 10000 requests in flight (503 beyond); 100 streams per HTTP/2 connection
session store: node-local: a student whose node is down waits up to 10s for it to come back, then goes to another node and must log in again
shutdown: in-flight requests get 30s to finish
health checks: GET /theme/image.php?theme=boost&component=theme&image=favicon every 2s, timeout 1s; an upstream is marked down after 3 failures in a row, up after 2 successes; healthy statuses: 200
snapshot: moodle-gateway.state (relative to the working directory), saved every 30s
route cookie: none (no [route_cookie] section)
table store: memory (this gateway's own table, deal and node states)
access log: off
session losses: a logged-in session Moodle replaces after 8h idle timed out; sooner, it was lost
surge: no cap (every request goes to its node at once, and PHP's own backlog queues the rest, first come first served)
asset cache: Moodle's revisioned theme and JavaScript answers that Moodle marks public, at most 64MiB in all and 2MiB each, answered from memory
compression: gzip or brotli at level 5 for text, HTML, JSON, JavaScript, CSS and SVG answers of at least 1KiB the node left uncompressed (12 media types), even those marked no-transform; never a range, a HEAD, an encoded body or a file offered in byte ranges
rate limits: login attempts not per address, 5 a minute per username (bursts of 10); page views without a logged-in session not per address; 429 beyond; each limit remembers 100000 addresses or usernames; a logged-in session is never limited
nodes:
  web1 http://192.168.1.1 weight 1
data server: data http://192.168.1.5
routing: SCORM files (/pluginfile.php/*/mod_scorm/..., and the same files via /webservice/pluginfile.php, /tokenpluginfile.php and legacy /file.php) go to the data server "data"; every other request goes to a PHP node: the one its MoodleSession cookie is bound to, otherwise the next by round-robin.
"#
    );
    assert_eq!(c.session.logged_in_idle, DEFAULT_LOGGED_IN_IDLE);
    assert_eq!(c.session.store, SessionStore::NodeLocal);
    assert_eq!(c.session.failover_hold, DEFAULT_FAILOVER_HOLD);
    assert_eq!(c.session.slow_start, DEFAULT_SLOW_START);
    assert_eq!(c.timeouts.shutdown, DEFAULT_SHUTDOWN);
    assert_eq!(c.timeouts.tunnel_idle, DEFAULT_TUNNEL_IDLE);
    assert_eq!(c.timeouts.keep_alive, DEFAULT_KEEP_ALIVE);
    assert!(c.site.hosts.is_empty() && c.tls.is_none());
    let l = &c.limits;
    assert_eq!(
        (l.max_header_bytes, l.max_headers, l.max_uri_bytes),
        (
            DEFAULT_MAX_HEADER_BYTES,
            DEFAULT_MAX_HEADERS,
            DEFAULT_MAX_URI_BYTES
        )
    );
    assert_eq!(l.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    assert_eq!(
        (l.max_connections, l.max_in_flight, l.http2_max_streams),
        (
            DEFAULT_MAX_CONNECTIONS,
            DEFAULT_MAX_IN_FLIGHT,
            DEFAULT_HTTP2_MAX_STREAMS
        )
    );
    let h = &c.health;
    assert_eq!(h.path, DEFAULT_HEALTH_PATH);
    assert_eq!(
        (h.interval, h.timeout),
        (DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_TIMEOUT)
    );
    assert_eq!((h.rise, h.fall), (DEFAULT_RISE, DEFAULT_FALL));
    assert_eq!(
        h.statuses,
        [StatusRange {
            low: 200,
            high: 200
        }]
    );
    assert_eq!(c.state.file.as_deref(), Some(Path::new(DEFAULT_STATE_FILE)));
    assert_eq!(c.state.save_every, DEFAULT_SAVE_EVERY);
    assert!(c.route_cookie.is_none());
    assert_eq!(c.nodes[0].state, NodeState::Active);
    assert_eq!(c.data.state, NodeState::Active);
    assert_eq!(c.base_dir, Path::new("/nonexistent"));
}

const FULL: &str = r#"listen = "[::]:80"
trusted_proxies = ["10.1.2.3/8", "192.0.2.7", "2001:db8::/32"]
[site]
path = "/moodle/"
hosts = ["Moodle.Example.edu", "moodle.example.edu:8443", "192.0.2.1", "[2001:DB8::1]:8080"]
[admin]
listen = "127.0.0.1:9999"
token = "s3cret-token-0123456789abcdef0123"
[session]
cookie = "MoodleSessionprod"
balance = "least-sessions"
max_sessions = 5_000
logged_in_idle = "2h 30m"
anonymous_idle = "15m"
sessiontimeout = "2h"
store = "shared"
failover_hold = "45s"
slow_start = "0"
[timeouts]
connect = "1s"
response_headers = "2m"
upstream_idle = "30s"
request_headers = "3s"
keep_alive = "2m"
body_idle = "20s"
shutdown = "2m"
tunnel_idle = "2h"
upload_min_rate = "2KiB"
upload_rate_window = "30s"
upload = "3h"
[limits]
max_header_bytes = "64KiB"
max_headers = 200
max_uri_bytes = 16384
max_body_bytes = "100MB"
buffer_body_bytes = "128KiB"
spool_body_bytes = "32MiB"
spool_max_bytes = "1GiB"
spool_dir = "/var/cache/moodle-gateway"
max_connections = 50_000
max_in_flight = 2000
http2_max_streams = 250
[health]
path = "/moodle/admin/tool/heartbeat/?fail=1"
interval = "10s"
timeout = "10s"
rise = 1
fall = 100
statuses = [200, "3xx", 0x1f4]
[state]
file = "/var/lib/moodle-gateway/table"
save_every = "5m"
[route_cookie]
name = "GW"
secret = "0123456789abcdef0123456789abcdef"
[access_log]
to = "/var/log/moodle-gateway/access.log"
format = "json"
[[nodes]]
name = "web1"
url = "http://192.168.1.1:8080/"
weight = 3
state = "active"
[[nodes]]
name = "web-2.b_c"
url = "HTTP://[fd00::2]"
state = "draining"
[[nodes]]
name = "web3"
url = "http://192.168.1.3"
state = "disabled"
[data]
name = "data"
url = "http://192.168.1.1:8081"
"#;

#[test]
fn a_full_config_reads_every_key() {
    let c = parse(FULL, None).unwrap();
    assert_eq!(
        c.describe(),
        r#"public listener: [::]:80
tls: off (plain HTTP)
admin listener: 127.0.0.1:9999 (token: set, from admin.token)
trusted proxies: 10.0.0.0/8, 192.0.2.7/32, 2001:db8::/32 (their X-Forwarded-For is extended)
site path: /moodle
site hosts: moodle.example.edu, moodle.example.edu:8443, 192.0.2.1, [2001:db8::1]:8080 (requests naming another host are refused)
session cookie: MoodleSessionprod (path /moodle/)
balance: least-sessions
slow start: off (a node back from down, draining or disabled gets its full share of new sessions at once)
sessions: at most 5000; forgotten after 2h 30m idle when logged in, 15m when anonymous
timeouts: connect 1s, response headers 2m, upstream idle 30s, request headers 3s, client keep-alive 2m, body idle 20s, tunnel idle 2h, uploads at least 2KiB/s over 30s and 3h in all
limits: request head 64KiB and 200 header lines (431 beyond), URI 16KiB (414 beyond), body 100MB (413 beyond), read whole before a node is contacted up to 128KiB, on disk up to 32MiB (1GiB at once, in /var/cache/moodle-gateway); 50000 connections and 2000 requests in flight (503 beyond); 250 streams per HTTP/2 connection
session store: shared: a student whose node is down goes to another node at once
shutdown: in-flight requests get 2m to finish
health checks: GET /moodle/admin/tool/heartbeat/?fail=1 (Host: moodle.example.edu) every 10s, timeout 10s; an upstream is marked down after 100 failures in a row, up after 1 success; healthy statuses: 200, 3xx, 500
snapshot: /var/lib/moodle-gateway/table, saved every 5m
route cookie: GW (secret: set, from route_cookie.secret)
table store: memory (this gateway's own table, deal and node states)
access log: /var/log/moodle-gateway/access.log, JSON lines, reopened on SIGHUP
session losses: a logged-in session Moodle replaces after 2h idle timed out; sooner, it was lost
surge: no cap (every request goes to its node at once, and PHP's own backlog queues the rest, first come first served)
asset cache: Moodle's revisioned theme and JavaScript answers that Moodle marks public, at most 64MiB in all and 2MiB each, answered from memory
compression: gzip or brotli at level 5 for text, HTML, JSON, JavaScript, CSS and SVG answers of at least 1KiB the node left uncompressed (12 media types), even those marked no-transform; never a range, a HEAD, an encoded body or a file offered in byte ranges
rate limits: login attempts not per address, 5 a minute per username (bursts of 10); page views without a logged-in session not per address; 429 beyond; each limit remembers 100000 addresses or usernames; a logged-in session is never limited
nodes:
  web1 http://192.168.1.1:8080 weight 3
  web-2.b_c http://[fd00::2] weight 1 (draining: keeps its sessions, gets no new ones)
  web3 http://192.168.1.3 weight 1 (disabled: gets no requests)
data server: data http://192.168.1.1:8081
routing: SCORM files (/moodle/pluginfile.php/*/mod_scorm/..., and the same files via /moodle/webservice/pluginfile.php, /moodle/tokenpluginfile.php and legacy /moodle/file.php) go to the data server "data"; every other request goes to a PHP node: the one its MoodleSessionprod cookie is bound to, otherwise the next by least-sessions.
"#
    );
    assert_eq!(
        c.admin.map(|a| a.token).as_deref(),
        Some("s3cret-token-0123456789abcdef0123")
    );
    assert_eq!(c.session.failover_hold, Duration::from_secs(45));
    assert_eq!(c.session.slow_start, Duration::ZERO, "off");
    assert_eq!(c.timeouts.tunnel_idle, Duration::from_secs(7200));
    assert_eq!(c.timeouts.keep_alive, Duration::from_secs(120));
    assert_eq!(c.limits.max_header_bytes, 65536);
    assert_eq!(c.limits.max_body_bytes, 100_000_000);
    assert_eq!(c.limits.buffer_body_bytes, 128 * 1024);
    assert_eq!(c.limits.spool_body_bytes, 32 << 20);
    assert_eq!(c.limits.spool_max_bytes, 1 << 30);
    assert_eq!(c.limits.spool_dir, Path::new("/var/cache/moodle-gateway"));
    assert_eq!(c.timeouts.upload_min_rate, 2048);
    assert_eq!(c.timeouts.upload_rate_window, Duration::from_secs(30));
    assert_eq!(c.timeouts.upload, Duration::from_secs(3 * 3600));
    let statuses =
        [(200, 200), (300, 399), (500, 500)].map(|(low, high)| StatusRange { low, high });
    assert_eq!(c.health.statuses, statuses);
    assert!(c.health.accepts(302) && !c.health.accepts(404));
    let route = c.route_cookie.unwrap();
    assert_eq!(route.secret, b"0123456789abcdef0123456789abcdef");
}

/// Asserts the errors for `doc` followed by a valid `[[nodes]]` and `[data]`.
fn check(doc: &str, want: &str) {
    assert_eq!(
        errors(&format!("{doc}\n{NODES}{DATA}")),
        want.trim(),
        "for {doc:?}"
    );
}

#[test]
fn slow_start_is_a_duration_up_to_an_hour_or_zero_for_none() {
    let window = |value: &str| {
        let text = format!("[session]\nslow_start = {value}\n{NODES}{DATA}");
        parse(&text, None).map(|c| c.session.slow_start)
    };
    assert_eq!(window("\"2s\"").unwrap(), Duration::from_secs(2));
    assert_eq!(window("\"0\"").unwrap(), Duration::ZERO);
    assert_eq!(window("\"0s\"").unwrap(), Duration::ZERO);
    check(
        "[session]\nslow_start = \"2h\"",
        r#"2: session.slow_start: "2h" is longer than an hour: a longer ramp only keeps a warm node idle"#,
    );
    check(
        "[session]\nslow_start = \"soon\"",
        r#"2: session.slow_start: "soon" is not a duration (like "5s", "90s" or "8h30m"), or "0" for no slow start"#,
    );
    check(
        "[session]\nslow_start = 60",
        r#"2: session.slow_start: expected a duration string (like "60s"), or "0" for none, found integer"#,
    );
}

#[test]
fn top_level_site_session_and_timeout_problems() {
    let doc = r#"listen = "localhost:80"
trusted_proxies = ["10.0.0.0/33", 7]
lisen = 1
[site]
path = "moodle"
[session]
cookie = "Moodle Session"
cookie_path = "moodle/"
balance = "random"
max_sessions = 0
logged_in_idle = "8"
anonymous_idle = 60
[timeouts]
connect = "0s"
read = "5s"
upstream_idle = "400 days""#;
    check(
        doc,
        r#"
1: listen: "localhost:80" is not an ip:port address (like "0.0.0.0:8080")
2: trusted_proxies[0]: "10.0.0.0/33" is not an IP address or CIDR (like "10.0.0.0/8")
2: trusted_proxies[1]: expected a string, found integer
3: lisen: unknown key (expected one of: listen, trusted_proxies, site, admin, session, timeouts, health, state, route_cookie, limits, tls, acme, offload, access_log, store, surge, cache, compression, rate_limits, nodes, data)
5: site.path: "moodle" must start with "/" (like "/moodle")
7: session.cookie: "Moodle Session" is not a valid cookie name
8: session.cookie_path: "moodle/" must start with "/"
9: session.balance: "random" is not "round-robin" or "least-sessions"
10: session.max_sessions: must be at least 1, got 0
11: session.logged_in_idle: "8" is not a duration (like "5s", "90s" or "8h30m")
12: session.anonymous_idle: expected a duration string (like "90s"), found integer
14: timeouts.connect: "0s" must be greater than 0
15: timeouts.read: unknown key (expected one of: connect, response_headers, upstream_idle, request_headers, keep_alive, body_idle, shutdown, tunnel_idle, upload_min_rate, upload_rate_window, upload)
16: timeouts.upstream_idle: "400 days" is longer than a year"#,
    );
    check("site = 3", "1: site: expected a table, found integer");
    check(
        "site.path = \"/a//b\"",
        r#"1: site.path: "/a//b" has an empty, "." or ".." segment"#,
    );
    let want = r#"1: site.path: "/mo odle" contains a character not allowed in a URL path"#;
    check("site.path = \"/mo odle\"", want);
    let want = "1: session.max_sessions: expected an integer, found string";
    check("session.max_sessions = \"many\"", want);
}

/// An admin token long enough for `check`.
const LONG_TOKEN: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn admin_problems() {
    let no_token = "no admin token: set token, token_file or MOODLE_GATEWAY_ADMIN_TOKEN";
    check("[admin]", &format!("1: admin.token: {no_token}"));
    check(
        "admin = \"yes\"",
        "1: admin: expected a table, found string",
    );
    let want = "1: admin.listen: 127.0.0.1:8080 clashes with the public listen 0.0.0.0:8080";
    check(
        &format!("admin = {{ listen = \"127.0.0.1:8080\", token = \"{LONG_TOKEN}\" }}"),
        want,
    );
    let want = "1: admin.token_file: set either token or token_file, not both";
    check(
        &format!("admin = {{ token = \"{LONG_TOKEN}\", token_file = \"t.txt\" }}"),
        want,
    );
    let want = "1: admin.token: must be printable ASCII without spaces";
    check("admin.token = \"two words\"", want);
    check("admin.token = \"\"", "1: admin.token: must not be empty");
    let short = "must be at least 32 characters, got 31 (generate one with: openssl rand -hex 32)";
    let token = &LONG_TOKEN[..31];
    check(
        &format!("admin.token = \"{token}\""),
        &format!("1: admin.token: {short}"),
    );
    let want = "1: admin.token_file: cannot read /nonexistent/t.txt: no such file or directory";
    assert!(errors(&format!("admin.token_file = \"t.txt\"\n{NODES}{DATA}")).starts_with(want));
}

#[test]
fn node_problems() {
    let doc = r#"[[nodes]]
name = "web 2"
url = "ftp://x"
weight = 1001
port = 80
[[nodes]]
name = ""
url = "https://x"
weight = "x"
[[nodes]]
weight = 2
[[nodes]]
name = "n3"
url = "http://x/moodle"
[[nodes]]
name = "n4"
url = "http://x?a=1"
[[nodes]]
name = "n5"
url = "http://u:p@x"
[[nodes]]
name = "n6"
url = "http://x:0"
[[nodes]]
name = "n7"
url = "http://:80"
[[nodes]]
name = "web1"
url = "http://192.168.1.1:80"
[[nodes]]
name = "n9"
url = "192.168.1.2""#;
    check(
        doc,
        r#"
2: nodes[0].name: "web 2" may only contain letters, digits, ".", "_" and "-"
3: nodes[0].url: "ftp://x" is not an http:// URL
4: nodes[0].weight: must be between 1 and 1000, got 1001
5: nodes[0].port: unknown key (expected one of: name, url, weight, state, max_active, low_priority_url)
7: nodes[1].name: must not be empty
8: nodes[1].url: "https://x": TLS to upstreams is not supported yet
9: nodes[1].weight: expected an integer, found string
10: nodes[2].name: missing required key
10: nodes[2].url: missing required key
14: nodes[3].url: "http://x/moodle" must be just http://host[:port], without a path
17: nodes[4].url: "http://x?a=1" must be just http://host[:port], without a path
20: nodes[5].url: "http://u:p@x" must not contain user info
23: nodes[6].url: "http://x:0" has no valid host[:port]
26: nodes[7].url: "http://:80" has no valid host[:port]
32: nodes[9].url: "192.168.1.2" is not an http:// URL
34: nodes[10].name: duplicate name "web1" (already used by nodes[8])
35: nodes[10].url: duplicate address "192.168.1.1:80" (already used by nodes[8])"#,
    );
}

#[test]
fn a_low_priority_url_is_a_second_pool_of_its_own_node() {
    let low = "low_priority_url = \"http://192.168.1.1:8081\"\n";
    let c = parse(&format!("{NODES}{low}{DATA}"), None).unwrap();
    let got = c.nodes[0].low_priority.as_ref().map(|a| a.as_str());
    assert_eq!(got, Some("192.168.1.1:8081"));
    let c = parse(&format!("{NODES}{DATA}"), None).unwrap();
    assert!(c.nodes[0].low_priority.is_none(), "none unless set");
    // `check` says that the cap holds for each pool.
    let capped = format!("[surge]\nmax_active = 2\n{NODES}{low}{DATA}");
    let said = parse(&capped, None).unwrap().describe();
    let pool = "web1 http://192.168.1.1 weight 1, at most 2 requests at once per pool";
    assert!(said.contains(pool), "{said}");
    let surge = "each node works on at most 2 requests at once (on each of its PHP pools";
    assert!(said.contains(surge), "{said}");
    // At an address that is already a node's or the data server's, its requests
    // would run at that pool's priority, or on a machine without the sessions.
    for (taken, at) in [
        ("192.168.1.1", "nodes[0].url"),
        ("192.168.1.5:80", "data.url"),
    ] {
        let low = format!("low_priority_url = \"http://{taken}\"\n");
        let want = format!(
            "4: nodes[0].low_priority_url: {taken} is already {at}: the low-priority \
             address must be a PHP pool of its own on this node"
        );
        assert_eq!(errors(&format!("{NODES}{low}{DATA}")), want);
    }
    let web2 = "[[nodes]]\nname = \"web2\"\nurl = \"http://192.168.1.2\"\n";
    let twice = format!("{NODES}{low}{web2}{low}{DATA}");
    let want = "8: nodes[1].low_priority_url: 192.168.1.1:8081 is already \
                nodes[0].low_priority_url: the low-priority address must be a PHP pool of \
                its own on this node";
    assert_eq!(errors(&twice), want);
    let want = "7: data.low_priority_url: unknown key (expected one of: name, url)";
    assert_eq!(errors(&format!("{NODES}{DATA}{low}")), want);
}

#[test]
fn node_names_fit_in_a_route_cookie() {
    let longest = "w".repeat(64);
    let c = parse(&format!("{}{DATA}", NODES.replace("web1", &longest)), None).unwrap();
    assert_eq!(c.nodes[0].name, longest);
    let doc = NODES.replace("web1", &"w".repeat(65));
    let want = "2: nodes[0].name: must be at most 64 characters, got 65";
    assert_eq!(errors(&format!("{doc}{DATA}")), want);
    let data = DATA.replace("\"data\"", &format!("{:?}", "d".repeat(65)));
    let want = "5: data.name: must be at most 64 characters, got 65";
    assert_eq!(errors(&format!("{NODES}{data}")), want);
}

#[test]
fn whole_file_problems() {
    let bad = |text: &str, want: &str| assert_eq!(errors(text), want, "for {text:?}");
    let no_nodes = "nodes: at least one [[nodes]] block is required";
    let no_data = "data: missing required section [data] (the server for SCORM files)";
    bad("", &format!("{no_nodes}\n{no_data}"));
    bad(NODES, no_data);
    bad(&format!("nodes = []\n{DATA}"), &format!("1: {no_nodes}"));
    let want = "1: nodes: expected an array of tables, found string";
    bad(&format!("nodes = \"web1\"\n{DATA}"), want);
    bad(
        &format!("nodes = [1]\n{DATA}"),
        "1: nodes[0]: expected a table, found integer",
    );
    let want = "7: data.weight: unknown key (expected one of: name, url)";
    bad(&format!("{NODES}{DATA}weight = 2"), want);
    let want = r#"5: data.name: duplicate name "web1" (already used by nodes[0])
6: data.url: duplicate address "192.168.1.1:80" (already used by nodes[0])"#;
    bad(
        &format!("{NODES}[data]\nname = \"web1\"\nurl = \"http://192.168.1.1/\""),
        want,
    );
    let want = "2: nodes[0].name: \"gateway\" is reserved: /metrics counts the gateway's own answers under it";
    bad(
        &format!("[[nodes]]\nname = \"gateway\"\nurl = \"http://192.168.1.1\"\n{DATA}"),
        want,
    );
    let want = "1: invalid TOML: string values must be quoted, expected literal string";
    bad("listen = \n", want);
    bad(
        &format!("{NODES}{DATA}name = \"again\""),
        "7: invalid TOML: duplicate key",
    );
}

#[test]
fn all_problems_come_back_together_sorted_by_line() {
    let text = format!(
        "[[nodes]]\nname = \"web1\"\nurl = \"ftp://h\"\n[session]\ncookies = \"x\"\n{NODES}{DATA}"
    );
    let errors = parse(&text, None).unwrap_err().with_source("gw.toml");
    assert_eq!(
        errors.to_string(),
        "gw.toml:3: nodes[0].url: \"ftp://h\" is not an http:// URL\n\
         gw.toml:5: session.cookies: unknown key (expected one of: cookie, cookie_path, balance, max_sessions, logged_in_idle, anonymous_idle, sessiontimeout, store, failover_hold, slow_start)\n\
         gw.toml:7: nodes[1].name: duplicate name \"web1\" (already used by nodes[0])"
    );
}

#[test]
fn admin_token_precedence_is_env_then_token_then_file() {
    let dir = std::env::temp_dir().join(format!("moodle-gateway-config-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("admin.token"),
        "  from-file-0123456789abcdef0123456  \nsecond line\n",
    )
    .unwrap();
    let admin = |keys: &str, env: Option<&str>| {
        let text = format!("[admin]\n{keys}\n{NODES}{DATA}");
        let env = ConfigEnv {
            admin_token: env.map(String::from),
            route_secret: None,
            store_secret: None,
            store_master_password: None,
            store_sentinel_password: None,
        };
        let a = Config::parse(&text, &dir, env).unwrap().admin.unwrap();
        (a.token, a.token_source)
    };
    let env = (
        "from-env-0123456789abcdef0123456789".to_owned(),
        TokenSource::Env,
    );
    assert_eq!(
        admin(
            "token = \"inline-0123456789abcdef0123456789ab\"",
            Some(" from-env-0123456789abcdef0123456789\n")
        ),
        env
    );
    assert_eq!(
        admin(
            "token_file = \"admin.token\"",
            Some("from-env-0123456789abcdef0123456789")
        ),
        env
    );
    assert_eq!(
        admin(
            "token_file = \"not-read\"",
            Some("from-env-0123456789abcdef0123456789")
        ),
        env
    );
    assert_eq!(
        admin(
            "token = \"inline-0123456789abcdef0123456789ab\"",
            Some("  ")
        ),
        (
            "inline-0123456789abcdef0123456789ab".into(),
            TokenSource::Token
        )
    );
    let file = (
        "from-file-0123456789abcdef0123456".to_owned(),
        TokenSource::TokenFile,
    );
    assert_eq!(admin("token_file = \"admin.token\"", None), file);
    let abs = format!(
        "token_file = {:?}",
        dir.join("admin.token").display().to_string()
    );
    assert_eq!(admin(&abs, None), file);
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn describe_and_debug_never_show_the_token() {
    let c = parse(FULL, Some("env-secret-0123456789abcdef0123456789")).unwrap();
    let want = "admin listener: 127.0.0.1:9999 (token: set, from MOODLE_GATEWAY_ADMIN_TOKEN)\n";
    assert!(c.describe().contains(want), "{}", c.describe());
    assert!(!c.describe().contains("env-secret") && !format!("{c:?}").contains("env-secret"));
}

#[test]
fn the_shipped_config_parses() {
    let env = ConfigEnv {
        admin_token: Some("from-env-0123456789abcdef0123456789".into()),
        route_secret: Some("route-from-env-0123456789abcdef0123".into()),
        ..ConfigEnv::default()
    };
    let c = Config::parse(
        include_str!("../../config.toml"),
        Path::new("/nonexistent"),
        env,
    )
    .unwrap();
    let names: Vec<_> = c.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["web1", "web2", "web3", "web4"]);
    assert_eq!(c.data.authority.as_str(), "192.168.1.5");
    assert_eq!(c.admin.as_ref().unwrap().token_source, TokenSource::Env);
    // It writes out every default it documents; [tls] stays commented out. The site
    // comes from wwwroot alone, and nothing in it is refused on a real Moodle.
    assert_eq!(c.site.hosts, ["moodle.example.edu"]);
    assert!(c.tls.is_none());
    assert_eq!(c.health.host.as_deref(), Some("moodle.example.edu"));
    assert_eq!(c.refusals(), []);
    // The route cookie is on: a crash between two snapshots logs nobody out.
    let route = c.route_cookie.as_ref().expect("[route_cookie] is on");
    assert_eq!(route.name, "MoodleGatewayRoute");
    assert_eq!(c.warnings(), []);
    let l = &c.limits;
    assert_eq!(
        (l.max_header_bytes, l.max_headers, l.max_uri_bytes),
        (
            DEFAULT_MAX_HEADER_BYTES,
            DEFAULT_MAX_HEADERS,
            DEFAULT_MAX_URI_BYTES
        )
    );
    assert_eq!(
        (l.max_body_bytes, l.max_connections, l.max_in_flight),
        (
            DEFAULT_MAX_BODY_BYTES,
            DEFAULT_MAX_CONNECTIONS,
            DEFAULT_MAX_IN_FLIGHT
        )
    );
    assert_eq!(l.http2_max_streams, DEFAULT_HTTP2_MAX_STREAMS);
    let t = &c.timeouts;
    assert_eq!(t.tunnel_idle, DEFAULT_TUNNEL_IDLE);
}

/// Pins the exact `check` stderr the integration test compares against:
/// every `fixtures/config/X.toml` fails (to parse, or as a file that cannot work on
/// a real Moodle) with exactly `X.expected`.
#[test]
fn broken_fixtures_report_exactly_their_expected_lines() {
    let mut checked = 0;
    for entry in fs::read_dir("fixtures/config").unwrap() {
        let path = format!(
            "fixtures/config/{}",
            entry.unwrap().file_name().to_string_lossy()
        );
        let Some(stem) = path.strip_suffix(".toml") else {
            continue;
        };
        let expected = fs::read_to_string(format!("{stem}.expected")).unwrap();
        let errors = Config::load_for_site(Path::new(&path)).expect_err(&path);
        assert_eq!(format!("{errors}\n"), expected, "for {path}");
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} fixtures");
    let missing = Config::load(Path::new("fixtures/config/nope.toml")).unwrap_err();
    let want = "fixtures/config/nope.toml: cannot read config file: no such file or directory";
    assert!(missing.to_string().starts_with(want), "{missing}");
}

#[test]
fn more_nodes_than_the_table_can_name_is_an_error() {
    let mut text = String::from("[data]\nname = \"data\"\nurl = \"http://10.9.9.9\"\n");
    for i in 0..1001 {
        text.push_str(&format!(
            "[[nodes]]\nname = \"n{i}\"\nurl = \"http://10.0.{}.{}\"\n",
            i / 250,
            i % 250 + 1
        ));
    }
    let errors = Config::parse(&text, Path::new("."), ConfigEnv::default()).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].key, "nodes");
    assert!(
        errors.0[0].message.starts_with("at most 1000 nodes"),
        "{errors}"
    );
}

#[test]
fn a_short_admin_token_is_an_error_naming_where_it_came_from() {
    let dir = std::env::temp_dir().join(format!("moodle-gateway-short-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("admin.token"), "s3cret\n").unwrap();
    let errors = |keys: &str, env: Option<&str>| {
        let text = format!("[admin]\n{keys}\n{NODES}{DATA}");
        let env = ConfigEnv {
            admin_token: env.map(String::from),
            route_secret: None,
            store_secret: None,
            store_master_password: None,
            store_sentinel_password: None,
        };
        match Config::parse(&text, &dir, env) {
            Ok(_) => panic!("a short token passed: {keys}"),
            Err(errors) => errors.to_string(),
        }
    };
    let short = |got: usize| format!("must be at least 32 characters, got {got}");
    let from_file = errors("token_file = \"admin.token\"", None);
    assert!(
        from_file.contains(&format!("admin.token_file: its first line {}", short(6))),
        "{from_file}"
    );
    let from_env = errors(&format!("token = \"{LONG_TOKEN}\""), Some("abc"));
    assert!(
        from_env.contains(&format!("MOODLE_GATEWAY_ADMIN_TOKEN {}", short(3))),
        "{from_env}"
    );
    fs::remove_dir_all(&dir).ok();
}

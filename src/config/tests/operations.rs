//! The operations settings: failover, shutdown grace, health checks, node states,
//! snapshots and the route cookie. Every default, every accepted form, and every
//! message with its line.

use super::*;

/// `text` parsed with `env` as the route secret's environment variable.
fn parse_env(
    text: &str,
    base_dir: &Path,
    route_secret: Option<&str>,
) -> Result<Config, ConfigErrors> {
    let env = ConfigEnv {
        admin_token: None,
        route_secret: route_secret.map(String::from),
        store_secret: None,
        store_master_password: None,
        store_sentinel_password: None,
    };
    Config::parse(text, base_dir, env)
}

/// `doc` followed by a valid `[[nodes]]` and `[data]`, parsed.
fn valid(doc: &str) -> Config {
    parse(&format!("{doc}\n{NODES}{DATA}"), None).unwrap()
}

const SECRET: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn session_store_and_failover_hold() {
    assert_eq!(
        valid("session.store = \"shared\"").session.store,
        SessionStore::Shared
    );
    let c = valid("session.store = \"node-local\"\nsession.failover_hold = \"1m\"");
    assert_eq!(c.session.store, SessionStore::NodeLocal);
    assert_eq!(c.session.failover_hold, Duration::from_secs(60));
    check(
        "[session]\nstore = \"redis\"\nfailover_hold = \"0s\"",
        r#"
2: session.store: "redis" is not "node-local" or "shared"
3: session.failover_hold: "0s" must be greater than 0"#,
    );
    let want = "1: session.store: expected a string, found boolean";
    check("session.store = true", want);
}

#[test]
fn shutdown_grace() {
    assert_eq!(
        valid("timeouts.shutdown = \"90s\"").timeouts.shutdown,
        Duration::from_secs(90)
    );
    let want = r#"1: timeouts.shutdown: "soon" is not a duration (like "5s", "90s" or "8h30m")"#;
    check("timeouts.shutdown = \"soon\"", want);
}

#[test]
fn health_host_is_a_plain_host_with_an_optional_port() {
    let host = |h: &str| valid(&format!("health.host = {h:?}")).health.host;
    assert_eq!(valid("").health.host, None);
    assert_eq!(
        host("moodle.example.edu").as_deref(),
        Some("moodle.example.edu")
    );
    assert_eq!(
        host("moodle.example.edu:8443").as_deref(),
        Some("moodle.example.edu:8443")
    );
    for bad in [
        "",
        "user@moodle.example.edu",
        "moodle.example.edu/path",
        "two words",
    ] {
        let want = format!(
            "1: health.host: {bad:?} is not a host name (like \"moodle.example.edu\" or \"moodle.example.edu:8443\")"
        );
        check(&format!("health.host = {bad:?}"), &want);
    }
}

#[test]
fn health_path_is_a_request_target_sent_as_written() {
    let path = |p: &str| valid(&format!("health.path = {p:?}")).health.path;
    assert_eq!(path("/admin/tool/heartbeat/"), "/admin/tool/heartbeat/");
    assert_eq!(path(DEFAULT_HEALTH_PATH), DEFAULT_HEALTH_PATH);
    assert_eq!(path("/moodle/login/?x=%20y&z"), "/moodle/login/?x=%20y&z");
    let bad = |p: &str, why: &str| {
        check(
            &format!("health.path = {p:?}"),
            &format!("1: health.path: {p:?} {why}"),
        )
    };
    bad(
        "admin/tool/heartbeat/",
        "must start with \"/\" (like \"/admin/tool/heartbeat/\")",
    );
    bad(
        "",
        "must start with \"/\" (like \"/admin/tool/heartbeat/\")",
    );
    bad(
        "/a#top",
        "must not have a fragment (\"#...\"): it is never sent to a server",
    );
    let chars = "contains a space, control or non-ASCII character (percent-encode it)";
    bad("/a b", chars);
    bad("/a\tb", chars);
    bad("/caf\u{e9}", chars);
    bad("/a<b>", "is not a valid path and query");
}

#[test]
fn health_timing_and_counts() {
    let c = valid("[health]\ninterval = \"5s\"\ntimeout = \"5s\"\nrise = 1\nfall = 100");
    let h = &c.health;
    assert_eq!(
        (h.interval, h.timeout),
        (Duration::from_secs(5), Duration::from_secs(5))
    );
    assert_eq!((h.rise, h.fall), (1, 100));
    let overlap = "probes must not overlap, so a probe must end before the next starts";
    check(
        "[health]\ninterval = \"2s\"\ntimeout = \"3s\"",
        &format!("3: health.timeout: 3s is longer than health.interval (2s): {overlap}"),
    );
    check(
        "[health]\ninterval = \"500ms\"",
        &format!("2: health.interval: 500ms is shorter than health.timeout (1s, its default): {overlap}; lower timeout too"),
    );
    // An invalid interval is one error, not two.
    check(
        "health.interval = \"0s\"",
        "1: health.interval: \"0s\" must be greater than 0",
    );
    check(
        "[health]\nrise = 0\nfall = 101\nprobe = 1",
        r#"
2: health.rise: must be between 1 and 100, got 0
3: health.fall: must be between 1 and 100, got 101
4: health.probe: unknown key (expected one of: path, host, interval, timeout, rise, fall, statuses)"#,
    );
    check("health = []", "1: health: expected a table, found array");
}

#[test]
fn health_statuses_are_codes_or_classes() {
    let statuses = |v: &str| valid(&format!("health.statuses = {v}")).health.statuses;
    let range = |low, high| StatusRange { low, high };
    assert_eq!(statuses("[204]"), [range(204, 204)]);
    assert_eq!(
        statuses("[\"1xx\", \"5xx\", 100, 599]"),
        [
            range(100, 199),
            range(500, 599),
            range(100, 100),
            range(599, 599)
        ]
    );
    check(
        "health.statuses = []",
        "1: health.statuses: must not be empty: list at least one status, like [200]",
    );
    check(
        "health.statuses = \"2xx\"",
        "1: health.statuses: expected an array, found string",
    );
    check(
        "health.statuses = [\n  99,\n  600,\n  \"6xx\",\n  \"2XX\",\n  true,\n  200,\n]",
        r#"
2: health.statuses[0]: must be between 100 and 599, got 99
3: health.statuses[1]: must be between 100 and 599, got 600
4: health.statuses[2]: "6xx" is not a status class ("1xx" to "5xx")
5: health.statuses[3]: "2XX" is not a status class ("1xx" to "5xx")
6: health.statuses[4]: expected a status (like 200) or a class (like "2xx"), found boolean"#,
    );
}

#[test]
fn node_state() {
    let text = format!(
        "{NODES}state = \"draining\"\n[[nodes]]\nname = \"web2\"\nurl = \"http://192.168.1.2\"\n{DATA}"
    );
    let c = parse(&text, None).unwrap();
    assert_eq!(
        c.nodes.iter().map(|n| n.state).collect::<Vec<_>>(),
        [NodeState::Draining, NodeState::Active]
    );
    let bad = |text: &str, want: &str| assert_eq!(errors(text), want, "for {text:?}");
    bad(
        &format!("{NODES}state = \"paused\"\n{DATA}"),
        "4: nodes[0].state: \"paused\" is not \"active\", \"draining\" or \"disabled\"",
    );
    bad(
        &format!("{NODES}{DATA}state = \"draining\""),
        "7: data.state: unknown key (expected one of: name, url)",
    );
}

#[test]
fn some_node_must_be_active() {
    let text = format!(
        "listen = \"0.0.0.0:80\"\n{NODES}state = \"draining\"\n\
         [[nodes]]\nname = \"web2\"\nurl = \"http://192.168.1.2\"\nstate = \"disabled\"\n{DATA}"
    );
    let want = "2: nodes: no node is \"active\", so no node can take new sessions: set state = \"active\" on at least one";
    assert_eq!(errors(&text), want);
}

#[test]
fn snapshot_file() {
    assert_eq!(valid("state.file = \"\"").state.file, None);
    let c = valid("[state]\nfile = \"run/table.state\"\nsave_every = \"10s\"");
    assert_eq!(
        c.state.file.as_deref(),
        Some(Path::new("run/table.state")),
        "kept relative"
    );
    assert_eq!(c.state.save_every, Duration::from_secs(10));
    let off = "\nsnapshot: off (the affinity table starts empty after a restart)\n";
    assert!(valid("state.file = \"\"").describe().contains(off));
    check(
        "[state]\nfile = \"/var/lib/gw/\"\nsave_every = \"-1s\"\npath = \"x\"",
        r#"
2: state.file: "/var/lib/gw/" names a directory: name the file, like "/var/lib/gw/moodle-gateway.state"
3: state.save_every: "-1s" is not a duration (like "5s", "90s" or "8h30m")
4: state.path: unknown key (expected one of: file, save_every)"#,
    );
    check(
        "state.file = 7",
        "1: state.file: expected a string, found integer",
    );
}

#[test]
fn route_cookie_problems() {
    let none = "no route cookie secret: set secret, secret_file or MOODLE_GATEWAY_ROUTE_SECRET";
    check("[route_cookie]", &format!("1: route_cookie.secret: {none}"));
    check(
        "route_cookie = { secret = \"short\" }",
        "1: route_cookie.secret: must be at least 32 bytes, got 5 (generate one with: openssl rand -hex 32)",
    );
    check(
        &format!("[route_cookie]\nsecret = {SECRET:?}\nsecret_file = \"route.secret\"\ncolour = 1"),
        r#"
3: route_cookie.secret_file: set either secret or secret_file, not both
4: route_cookie.colour: unknown key (expected one of: name, secret, secret_file)"#,
    );
    let clash = "the route cookie must never touch Moodle's cookie";
    check(
        &format!("[route_cookie]\nname = \"moodlesession\"\nsecret = {SECRET:?}"),
        &format!("2: route_cookie.name: \"moodlesession\" is the session cookie ([session] cookie): {clash}"),
    );
    check(
        &format!("session.cookie = \"MoodleGatewayRoute\"\n[route_cookie]\nsecret = {SECRET:?}"),
        &format!("2: route_cookie.name: \"MoodleGatewayRoute\" is the session cookie ([session] cookie): {clash}"),
    );
    check(
        &format!("[route_cookie]\nname = \"a;b\"\nsecret = {SECRET:?}"),
        "2: route_cookie.name: \"a;b\" is not a valid cookie name",
    );
    let want =
        "1: route_cookie.secret_file: cannot read /nonexistent/r.secret: no such file or directory";
    assert!(errors(&format!(
        "route_cookie.secret_file = \"r.secret\"\n{NODES}{DATA}"
    ))
    .starts_with(want));
}

#[test]
fn route_secret_precedence_is_env_then_secret_then_file() {
    let dir = std::env::temp_dir().join(format!("moodle-gateway-route-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("route.secret"),
        format!("  {SECRET}-file \nsecond line\n"),
    )
    .unwrap();
    fs::write(dir.join("short.secret"), "abc\n").unwrap();
    let env_secret = format!("{SECRET}-env");
    let route = |keys: &str, env: Option<&str>| {
        let text = format!("[route_cookie]\n{keys}\n{NODES}{DATA}");
        let r = parse_env(&text, &dir, env).unwrap().route_cookie.unwrap();
        (String::from_utf8(r.secret).unwrap(), r.secret_source)
    };
    let env = (env_secret.clone(), SecretSource::Env);
    assert_eq!(
        route("secret = \"inline\"", Some(&format!(" {env_secret}\n"))),
        env
    );
    assert_eq!(route("secret_file = \"not-read\"", Some(&env_secret)), env);
    let inline = format!("secret = \"{SECRET}-inline\"");
    assert_eq!(
        route(&inline, Some("  ")),
        (format!("{SECRET}-inline"), SecretSource::Secret)
    );
    let file = (format!("{SECRET}-file"), SecretSource::SecretFile);
    assert_eq!(route("secret_file = \"route.secret\"", None), file);
    let abs = format!(
        "secret_file = {:?}",
        dir.join("route.secret").display().to_string()
    );
    assert_eq!(route(&abs, None), file);
    let short = |keys: &str, env: Option<&str>| {
        let text = format!("[route_cookie]\n{keys}\n{NODES}{DATA}");
        parse_env(&text, &dir, env).unwrap_err().to_string()
    };
    let hint = "(generate one with: openssl rand -hex 32)";
    assert_eq!(
        short("secret_file = \"short.secret\"", None),
        format!(
            "2: route_cookie.secret_file: its first line must be at least 32 bytes, got 3 {hint}"
        )
    );
    assert_eq!(
        short("", Some("abc")),
        format!("route_cookie.secret: MOODLE_GATEWAY_ROUTE_SECRET must be at least 32 bytes, got 3 {hint}")
    );
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn describe_and_debug_never_show_the_route_secret() {
    let text = format!("[route_cookie]\nsecret = \"{SECRET}\"\n{NODES}{DATA}");
    let c = parse_env(
        &text,
        Path::new("."),
        Some("the-environment-secret-is-32-bytes"),
    )
    .unwrap();
    let d = c.describe();
    let want = "route cookie: MoodleGatewayRoute (secret: set, from MOODLE_GATEWAY_ROUTE_SECRET)\n";
    assert!(d.contains(want), "{d}");
    let debug = format!("{c:?}");
    assert!(
        !d.contains("environment-secret") && !debug.contains("environment-secret"),
        "{debug}"
    );
    let env = ConfigEnv {
        admin_token: Some("admin-secret".into()),
        route_secret: None,
        store_secret: None,
        store_master_password: None,
        store_sentinel_password: None,
    };
    assert_eq!(
        format!("{env:?}"),
        "ConfigEnv { admin_token: \"<set>\", route_secret: \"<unset>\", store_secret: \"<unset>\", store_master_password: \"<unset>\", store_sentinel_password: \"<unset>\" }"
    );
}

#[test]
fn several_operations_problems_come_back_together() {
    let text = format!(
        "[session]\nstore = \"sticky\"\n[health]\ntimeout = \"5s\"\n[route_cookie]\n{NODES}state = \"disabled\"\n{DATA}"
    );
    let errors = errors(&text);
    let lines: Vec<_> = errors
        .lines()
        .map(|l| l.split(": ").take(2).collect::<Vec<_>>().join(": "))
        .collect();
    assert_eq!(
        lines,
        [
            "2: session.store",
            "4: health.timeout",
            "5: route_cookie.secret",
            "6: nodes"
        ],
        "{errors}"
    );
}

#[test]
fn access_log_mistakes_name_the_key_and_the_way_out() {
    let text =
        format!("[access_log]\nto = \"\"\nformat = \"apache\"\nrotate = true\n{NODES}{DATA}");
    assert_eq!(
        errors(&text),
        "2: access_log.to: must not be empty: use \"off\", \"stderr\" or a file path\n\
         3: access_log.format: \"apache\" is not a format: use \"combined\" or \"json\"\n\
         4: access_log.rotate: unknown key (expected one of: to, format)"
    );
    let directory = format!("[access_log]\nto = \"/var/log/\"\n{NODES}{DATA}");
    assert_eq!(
        errors(&directory),
        "2: access_log.to: \"/var/log/\" names a directory: name the file, like \"/var/log/access.log\""
    );
}

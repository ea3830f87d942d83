//! The edge settings: allowed hosts, request limits, client timeouts and TLS.
//! Every default, every accepted form, and every message with its line.

use super::*;
use crate::config::values::{format_size, parse_size};

/// `doc` followed by a valid `[[nodes]]` and `[data]`, parsed.
fn valid(doc: &str) -> Config {
    parse(&format!("{doc}\n{NODES}{DATA}"), None).unwrap()
}

#[test]
fn a_size_is_bytes_or_a_number_with_a_unit() {
    let sizes = [
        ("512", 512),
        ("0", 0),
        ("256B", 256),
        ("8k", 8 << 10),
        ("8K", 8 << 10),
        ("32KiB", 32 << 10),
        ("32 kib", 32 << 10),
        ("2KB", 2_000),
        ("1m", 1 << 20),
        ("100MiB", 100 << 20),
        ("100MB", 100_000_000),
        ("2GiB", 2 << 30),
        ("2g", 2 << 30),
        ("3GB", 3_000_000_000),
        ("1TiB", 1 << 40),
        ("1TB", 1_000_000_000_000),
        (" 64KiB ", 64 << 10),
    ];
    for (raw, want) in sizes {
        assert_eq!(parse_size(raw), Ok(want), "for {raw:?}");
    }
    for raw in [
        "", "KiB", "2 gigs", "1.5GiB", "-1", "+1", "1_000", "0x10", "5 KiB B", "1e3", "k8",
    ] {
        let want = format!("{raw:?} is not a size (like \"32KiB\", \"100MiB\" or 4096)");
        assert_eq!(parse_size(raw), Err(want), "for {raw:?}");
    }
    let huge = "99999999TiB";
    assert_eq!(parse_size(huge), Err(format!("{huge:?} is too large")));
}

#[test]
fn a_size_is_shown_in_the_largest_unit_that_holds_it_exactly() {
    let shown = [
        (0, "0B"),
        (1, "1B"),
        (1500, "1500B"),
        (2_000, "2KB"),
        (256, "256B"),
        (32 << 10, "32KiB"),
        (1 << 20, "1MiB"),
        (100_000_000, "100MB"),
        (2 << 30, "2GiB"),
        (1 << 40, "1TiB"),
    ];
    for (n, want) in shown {
        assert_eq!(format_size(n), want, "for {n}");
    }
}

#[test]
fn site_hosts_are_lowercase_host_names_with_an_optional_port() {
    assert!(valid("").site.hosts.is_empty());
    assert!(valid("site.hosts = []").site.hosts.is_empty());
    let c = valid(
        r#"site.hosts = ["MOODLE.example.edu", "moodle.example.edu:8443", "10.0.0.1", "[::1]"]"#,
    );
    let want = [
        "moodle.example.edu",
        "moodle.example.edu:8443",
        "10.0.0.1",
        "[::1]",
    ];
    assert_eq!(c.site.hosts, want);
    let like = "is not a host name (like \"moodle.example.edu\" or \"moodle.example.edu:8443\")";
    check(
        r#"[site]
hosts = [
  "moodle.example.edu",
  "Moodle.Example.EDU",
  "moodle.example.edu:0",
  "https://moodle.example.edu",
  "moodle.example.edu/moodle",
  "*.example.edu",
  "-bad.example.edu",
  "::1",
  "[::1]8080",
  "host:",
  "",
  443,
]"#,
        &format!(
            r#"
4: site.hosts[1]: duplicate host "moodle.example.edu" (already listed as site.hosts[0])
5: site.hosts[2]: "moodle.example.edu:0" {like}
6: site.hosts[3]: "https://moodle.example.edu" {like}
7: site.hosts[4]: "moodle.example.edu/moodle" {like}
8: site.hosts[5]: "*.example.edu" {like}
9: site.hosts[6]: "-bad.example.edu" {like}
10: site.hosts[7]: "::1" {like}
11: site.hosts[8]: "[::1]8080" {like}
12: site.hosts[9]: "host:" {like}
13: site.hosts[10]: "" {like}
14: site.hosts[11]: expected a string, found integer"#
        ),
    );
    check(
        "site.hosts = \"moodle.example.edu\"",
        "1: site.hosts: expected an array, found string",
    );
    let want = "1: site.host: unknown key (expected one of: wwwroot, path, hosts)";
    check("site.host = []", want);
}

#[test]
fn limits_take_sizes_and_counts() {
    let c = valid(
        r#"[limits]
max_header_bytes = 1024
max_headers = 1
max_uri_bytes = "256B"
max_body_bytes = "1TiB"
max_connections = 1_000_000
max_in_flight = 1
http2_max_streams = 10_000"#,
    );
    let l = &c.limits;
    assert_eq!(
        (l.max_header_bytes, l.max_headers, l.max_uri_bytes),
        (1024, 1, 256)
    );
    assert_eq!(l.max_body_bytes, 1 << 40);
    assert_eq!(
        (l.max_connections, l.max_in_flight, l.http2_max_streams),
        (1_000_000, 1, 10_000)
    );
    let c = valid("limits.max_header_bytes = \"1MiB\"\nlimits.max_uri_bytes = \"64k\"");
    assert_eq!(
        (c.limits.max_header_bytes, c.limits.max_uri_bytes),
        (1 << 20, 64 << 10)
    );
    assert_eq!(valid("limits.max_body_bytes = 1").limits.max_body_bytes, 1);
}

#[test]
fn limits_out_of_range_or_of_the_wrong_type() {
    check(
        r#"[limits]
max_header_bytes = "1023"
max_headers = 1001
max_uri_bytes = "65KiB"
max_body_bytes = 0
max_connections = 0
max_in_flight = 1_000_001
http2_max_streams = 10_001
max_body = "1GiB""#,
        r#"
2: limits.max_header_bytes: must be between 1KiB and 1MiB, got 1023B
3: limits.max_headers: must be between 1 and 1000, got 1001
4: limits.max_uri_bytes: must be between 256B and 64KiB, got 65KiB
5: limits.max_body_bytes: must be between 1B and 1TiB, got 0B
6: limits.max_connections: must be between 1 and 1000000, got 0
7: limits.max_in_flight: must be between 1 and 1000000, got 1000001
8: limits.http2_max_streams: must be between 1 and 10000, got 10001
9: limits.max_body: unknown key (expected one of: max_header_bytes, max_headers, max_uri_bytes, max_body_bytes, buffer_body_bytes, spool_body_bytes, spool_max_bytes, spool_dir, max_connections, max_in_flight, http2_max_streams)"#,
    );
    check(
        r#"[limits]
max_header_bytes = "2MiB"
max_uri_bytes = -5
max_body_bytes = "2 gigs"
max_headers = "100"
http2_max_streams = 1.5"#,
        r#"
2: limits.max_header_bytes: must be between 1KiB and 1MiB, got 2MiB
3: limits.max_uri_bytes: must be between 256B and 64KiB, got -5
4: limits.max_body_bytes: "2 gigs" is not a size (like "32KiB", "100MiB" or 4096)
5: limits.max_headers: expected an integer, found string
6: limits.http2_max_streams: expected an integer, found float"#,
    );
    let want = "1: limits.max_body_bytes: expected a size (like \"32KiB\" or 4096), found boolean";
    check("limits.max_body_bytes = true", want);
    check("limits = 5", "1: limits: expected a table, found integer");
}

/// A spool that could never take a body (its limit within the buffer's, or above
/// the spool's own size) is an error on the key that was written.
#[test]
fn spool_limits_that_could_never_spool_a_body_name_their_key() {
    check(
        r#"[limits]
buffer_body_bytes = "1MiB"
spool_body_bytes = "512KiB"
spool_max_bytes = "100KiB"
spool_dir = """#,
        r#"
3: limits.spool_body_bytes: 512KiB is not above limits.buffer_body_bytes (1MiB): such bodies are read into memory already; raise it, or 0 turns the spool off
4: limits.spool_max_bytes: must be between 1MiB and 64TiB, got 100KiB
5: limits.spool_dir: must name a directory (spool_body_bytes = 0 turns the spool off)"#,
    );
    check(
        "[limits]\nspool_max_bytes = \"32MiB\"",
        "2: limits.spool_max_bytes: limits.spool_body_bytes (64MiB) is above limits.spool_max_bytes (32MiB): the spool could never hold such a body",
    );
    check(
        "[limits]\nspool_body_bytes = \"8GiB\"",
        "2: limits.spool_body_bytes: limits.spool_body_bytes (8GiB) is above limits.spool_max_bytes (4GiB): the spool could never hold such a body",
    );
    let off =
        format!("[limits]\nspool_body_bytes = 0\nbuffer_body_bytes = \"16MiB\"\n{NODES}{DATA}");
    let config = Config::parse(&off, Path::new("."), Default::default()).unwrap();
    assert_eq!(config.limits.spool_body_bytes, 0);
}

/// The request line is part of the head: a URI limit above the head limit
/// could never be reached. The written key is blamed.
#[test]
fn the_uri_limit_fits_in_the_head_limit() {
    let c = valid("limits.max_header_bytes = \"8KiB\"\nlimits.max_uri_bytes = \"8KiB\"");
    assert_eq!(c.limits.max_uri_bytes, c.limits.max_header_bytes);
    let part = "the request line is part of the request head";
    check(
        "[limits]\nmax_header_bytes = \"16KiB\"\nmax_uri_bytes = \"32KiB\"",
        &format!("3: limits.max_uri_bytes: 32KiB is above limits.max_header_bytes (16KiB): {part}"),
    );
    check(
        "limits.max_uri_bytes = \"64KiB\"",
        &format!("1: limits.max_uri_bytes: 64KiB is above limits.max_header_bytes (32KiB): {part}"),
    );
    check(
        "limits.max_header_bytes = \"4KiB\"",
        &format!(
            "1: limits.max_header_bytes: 4KiB is below limits.max_uri_bytes (8KiB, its default): \
             {part}; lower max_uri_bytes too"
        ),
    );
    // An invalid value is reported once, not compared.
    check(
        "limits.max_header_bytes = \"4KiB\"\nlimits.max_uri_bytes = \"huge\"",
        "2: limits.max_uri_bytes: \"huge\" is not a size (like \"32KiB\", \"100MiB\" or 4096)",
    );
}

#[test]
fn tunnel_idle_is_a_duration() {
    let c = valid("timeouts.tunnel_idle = \"8h\"");
    assert_eq!(c.timeouts.tunnel_idle, Duration::from_secs(8 * 3600));
    check(
        "[timeouts]\ntunnel_idle = 3600",
        r#"
2: timeouts.tunnel_idle: expected a duration string (like "90s"), found integer"#,
    );
}

#[test]
fn keep_alive_is_bounded_between_a_second_and_an_hour() {
    let want = "1: timeouts.keep_alive: must be between 1s and 1h";
    check("timeouts.keep_alive = \"2h\"", want);
    check("timeouts.keep_alive = \"500ms\"", want);
    let want = r#"1: timeouts.keep_alive: "0s" must be greater than 0"#;
    check("timeouts.keep_alive = \"0s\"", want);
    let bounds = ["1s", "1h"].map(|d| valid(&format!("timeouts.keep_alive = \"{d}\"")));
    let bounds = bounds.map(|c| c.timeouts.keep_alive.as_secs());
    assert_eq!(bounds, [1, 3600]);
}

#[test]
fn wwwroot_gives_the_site_its_path_host_and_probe() {
    let c = valid(
        "[site]\nwwwroot = \"HTTPS://Moodle.Example.edu:8443/moodle/\"\n\
         hosts = [\"alias.example.edu\", \"moodle.example.edu:8443\"]\n",
    );
    let w = c.site.wwwroot.as_ref().unwrap();
    assert_eq!(
        (w.https, w.host.as_str(), w.port, w.path.as_str()),
        (true, "moodle.example.edu:8443", Some(8443), "/moodle")
    );
    assert_eq!(w.url, "HTTPS://Moodle.Example.edu:8443/moodle");
    assert_eq!(c.site.path, "/moodle");
    // wwwroot's host first, an alias after it, and no repeat.
    assert_eq!(
        c.site.hosts,
        ["moodle.example.edu:8443", "alias.example.edu"]
    );
    assert_eq!(c.session.cookie_path, "/moodle/");
    assert_eq!(
        c.health.path,
        "/moodle/theme/image.php?theme=boost&component=theme&image=favicon"
    );
    assert_eq!(c.health.host.as_deref(), Some("moodle.example.edu:8443"));
}

#[test]
fn a_wwwroot_moodle_would_not_accept_names_the_key_and_the_reason() {
    for (wwwroot, want) in [
        ("moodle.example.edu", "must start with https:// or http://"),
        (
            "ftp://moodle.example.edu",
            "must start with https:// or http://",
        ),
        (
            "https://moodle.example.edu/?x=1",
            "must not carry a query or fragment",
        ),
        (
            "https://admin:pw@moodle.example.edu",
            "must not carry a user name or password",
        ),
        ("https://", "has no valid host name"),
        ("https://moodle.example.edu:0", "has no valid host name"),
        (
            "https://moodle.example.edu/a//b",
            "empty, \".\" or \"..\" segment",
        ),
    ] {
        let text = errors(&format!("[site]\nwwwroot = {wwwroot:?}\n{NODES}{DATA}"));
        assert!(text.starts_with("2: site.wwwroot: "), "{wwwroot}: {text}");
        assert!(text.contains(want), "{wwwroot}: {text}");
    }
}

#[test]
fn a_path_beside_wwwroot_could_only_disagree_with_it() {
    let doc = "[site]\nwwwroot = \"https://example.edu/moodle\"\npath = \"/moodle\"\n";
    assert_eq!(
        errors(&format!("{doc}{NODES}{DATA}")),
        "3: site.path: the path comes from site.wwwroot (\"/moodle\"): remove site.path"
    );
}

#[test]
fn offload_names_the_export_and_lets_node_local_sessions_keep_scorm() {
    let c = valid("[offload]\nurl = \"http://10.0.0.5:8080\"\n");
    let o = c.offload.as_ref().unwrap();
    assert_eq!(
        (o.authority.as_str(), o.prefix.as_str()),
        ("10.0.0.5:8080", "/dataroot/")
    );
    assert_eq!(
        c.refusals(),
        [],
        "node-local sessions are fine with the offload"
    );
    assert!(c.describe().contains("file offload: "), "{}", c.describe());
    let without = valid("");
    assert_eq!(without.refusals()[0].key, "session.store");
}

#[test]
fn offload_problems_name_their_key() {
    let text = errors(&format!("[offload]\nprefix = \"dataroot\"\n{NODES}{DATA}"));
    assert_eq!(
        text,
        "1: offload.url: missing required key\n\
         2: offload.prefix: \"dataroot\" must be a path that starts and ends with \"/\", like \
         \"/dataroot/\" (the key of $CFG->xsendfilealiases)"
    );
    let text = errors(&format!(
        "[offload]\nurl = \"https://10.0.0.5\"\n{NODES}{DATA}"
    ));
    assert!(text.starts_with("2: offload.url: "), "{text}");
}

#[test]
fn the_export_is_probed_at_its_prefix_unless_a_probe_file_is_named_under_it() {
    let c = valid("[offload]\nurl = \"http://10.0.0.5:8080\"\n");
    assert_eq!(c.offload.as_ref().unwrap().probe, None);
    assert!(
        c.describe()
            .contains("probed every 2s with GET /dataroot/ (up: any answer below 500)"),
        "{}",
        c.describe()
    );
    let c = valid(
        "[offload]\nurl = \"http://10.0.0.5:8080\"\nprobe = \"/dataroot/filedir/probe.txt\"\n",
    );
    let probe = c.offload.as_ref().unwrap().probe.as_deref();
    assert_eq!(probe, Some("/dataroot/filedir/probe.txt"));
    assert!(c
        .describe()
        .contains("GET /dataroot/filedir/probe.txt (up: 2xx)"));
    for bad in [
        "/etc/passwd",
        "/dataroot/",
        "/dataroot/../x",
        "/dataroot/a b",
        "/dataroot/d/",
    ] {
        let text = errors(&format!(
            "[offload]\nurl = \"http://10.0.0.5:8080\"\nprobe = {bad:?}\n{NODES}{DATA}"
        ));
        assert_eq!(
            text,
            format!(
                "3: offload.probe: {bad:?} must be a file under offload.prefix (\"/dataroot/\") \
                 in plain characters, like \"/dataroot/filedir/probe.txt\": the export must \
                 answer it 2xx"
            ),
        );
    }
    let text = errors(&format!(
        "[offload]\nurl = \"http://10.0.0.5:8080\"\nprobes = \"/x\"\n{NODES}{DATA}"
    ));
    assert!(
        text.contains("offload.probes: unknown key (expected one of: url, prefix, probe)"),
        "{text}"
    );
}

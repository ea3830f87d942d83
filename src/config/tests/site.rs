//! What `check` judges beyond each value: the refusals and warnings of a whole
//! config, each on its line, in one list with the file's other errors.

use super::*;

/// Every problem `check` reports for `text`, one `<line>: <key>: <message>` per line,
/// or `Ok` with the warnings of an accepted file.
fn site(text: &str, base_dir: &Path) -> Result<String, String> {
    let shown = |problems: ConfigErrors| {
        let lines: Vec<String> = problems.0.iter().map(ToString::to_string).collect();
        lines.join("\n")
    };
    match Config::parse_for_site(text, base_dir, ConfigEnv::default()) {
        Ok((_, warnings)) => Ok(shown(warnings)),
        Err(problems) => Err(shown(problems)),
    }
}

/// The lines and keys of the errors `check` reports for `text`, one `<line> <key>` each.
fn refused(text: &str) -> Vec<String> {
    let problems = match Config::parse_for_site(text, Path::new("."), ConfigEnv::default()) {
        Ok(_) => return Vec::new(),
        Err(problems) => problems.0,
    };
    let errors = problems.iter().filter(|p| p.severity == Severity::Error);
    let at =
        |p: &ConfigError| format!("{} {}", p.line.map_or("-".into(), |l| l.to_string()), p.key);
    errors.map(at).collect()
}

const SHARED: &str = "[session]\nstore = \"shared\"\n";

#[test]
fn the_node_local_refusal_has_its_line_and_comes_with_the_files_other_errors() {
    let text = format!(
        "listen = \"0.0.0.0:8080\"\nlistne = \"x\"\n[session]\nstore = \"node-local\"\n{NODES}{DATA}"
    );
    assert_eq!(refused(&text), ["2 listne", "4 session.store"]);
    let problems = site(&text, Path::new(".")).unwrap_err();
    assert!(
        problems.contains(
            "4: session.store: node-local sessions with SCORM files sent to the data server (data)"
        ),
        "{problems}"
    );
}

#[test]
fn an_unwritten_store_is_blamed_on_its_section_or_else_on_the_data_server() {
    let in_section = format!("[session]\ncookie = \"MoodleSession\"\n{NODES}{DATA}");
    assert_eq!(refused(&in_section), ["1 session.store"]);
    // NODES is three lines: [data] is the fourth.
    assert_eq!(refused(&format!("{NODES}{DATA}")), ["4 session.store"]);
}

#[test]
fn a_rule_is_not_judged_while_a_key_it_reads_is_wrong() {
    // The store's own error stands in for the refusal a default would earn.
    let text = format!("[session]\nstore = \"sharde\"\n{NODES}{DATA}");
    assert_eq!(refused(&text), ["2 session.store"]);
    assert_eq!(
        site(&text, Path::new(".")).unwrap_err(),
        "2: session.store: \"sharde\" is not \"node-local\" or \"shared\""
    );
}

#[test]
fn a_body_limit_below_moodles_smallest_upload_limit_is_refused_with_the_reason() {
    let text = format!("{SHARED}[limits]\nmax_body_bytes = 100\n{NODES}{DATA}");
    let problems = site(&text, Path::new(".")).unwrap_err();
    assert_eq!(
        problems,
        "4: limits.max_body_bytes: 100B is below 10KiB, the smallest upload limit Moodle \
         offers: every larger request body (a login form, a forum post, a quiz page, any \
         upload) would be refused with 413 before it reaches Moodle. Set it to PHP's \
         post_max_size (8MiB unless php.ini says otherwise)"
    );
    let floor = format!("{SHARED}[limits]\nmax_body_bytes = \"10KiB\"\n{NODES}{DATA}");
    assert_eq!(site(&floor, Path::new(".")), Ok(String::new()));
}

#[test]
fn an_http_wwwroot_with_tls_at_the_gateway_is_refused() {
    let dir = std::env::temp_dir().join(format!("mg-site-tls-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let armour = |label: &str| format!("-----BEGIN {label}-----\nMIIB\n-----END {label}-----\n");
    fs::write(dir.join("cert.pem"), armour("CERTIFICATE")).unwrap();
    fs::write(dir.join("key.pem"), armour("PRIVATE KEY")).unwrap();
    let tls = "[tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\nredirect_listen = \"0.0.0.0:80\"\n";
    let site_with = |scheme: &str| {
        let text = format!(
            "listen = \"0.0.0.0:443\"\n[site]\nwwwroot = \"{scheme}://moodle.example.edu\"\n\
             {SHARED}{tls}{NODES}{DATA}"
        );
        site(&text, &dir)
    };
    let problems = site_with("http").unwrap_err();
    assert!(
        problems.starts_with(
            "3: site.wwwroot: http://moodle.example.edu is plain HTTP, but [tls] makes the \
             gateway speak HTTPS on 0.0.0.0:443"
        ) && problems.contains("$CFG->sslproxy = true"),
        "{problems}"
    );
    assert_eq!(site_with("https"), Ok(String::new()));
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_state_file_or_access_log_in_a_missing_directory_is_refused() {
    let dir = std::env::temp_dir().join(format!("mg-site-dirs-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("a-file"), "").unwrap();
    let at = |file: &str, log: &str| {
        let (file, log) = (dir.join(file), dir.join(log));
        let text = format!(
            "{SHARED}[state]\nfile = {:?}\n[access_log]\nto = {:?}\n{NODES}{DATA}",
            file.display().to_string(),
            log.display().to_string()
        );
        site(&text, Path::new(".")).map_err(|p| p.replace(&dir.display().to_string(), "DIR"))
    };
    assert_eq!(at("gateway.state", "access.log"), Ok(String::new()));
    let problems = at("missing/gateway.state", "a-file/access.log").unwrap_err();
    assert_eq!(
        problems,
        "4: state.file: directory DIR/missing does not exist: the gateway could not save its \
         session table and would start with an empty one after every restart, when every \
         student is dealt to a node afresh. Create the directory, writable by the user the \
         gateway runs as, or name another; \"\" keeps no snapshot\n\
         6: access_log.to: DIR/a-file is not a directory: the gateway could not open its \
         access log and would not start. Create the directory, writable by the user the \
         gateway runs as (the Debian package makes /var/log/moodle-gateway), or name another"
    );
}

#[test]
fn with_node_local_sessions_a_lost_table_is_named_as_logging_students_out() {
    let text = format!(
        "[session]\nstore = \"node-local\"\n[offload]\nurl = \"http://192.168.1.5:8081\"\n\
         [state]\nfile = \"/nonexistent-moodle-gateway/table\"\n\
         [route_cookie]\nsecret = \"0123456789abcdef0123456789abcdef\"\n{NODES}{DATA}"
    );
    let problems = site(&text, Path::new(".")).unwrap_err();
    assert!(
        problems.starts_with("6: state.file: directory /nonexistent-moodle-gateway does not exist")
            && problems.contains("every logged-in student is dealt to a new node and logged out"),
        "{problems}"
    );
}

#[test]
fn a_state_file_in_the_working_directory_needs_no_directory_of_its_own() {
    let text = format!("{SHARED}[state]\nfile = \"gateway.state\"\n{NODES}{DATA}");
    assert_eq!(site(&text, Path::new(".")), Ok(String::new()));
    let off = format!("{SHARED}[state]\nfile = \"\"\n{NODES}{DATA}");
    assert_eq!(site(&off, Path::new(".")), Ok(String::new()));
}

#[test]
fn a_warning_is_said_beside_the_errors_and_alone_does_not_refuse_the_file() {
    let node_local =
        "[session]\nstore = \"node-local\"\n[offload]\nurl = \"http://192.168.1.5:8081\"\n";
    let warned = site(&format!("{node_local}{NODES}{DATA}"), Path::new(".")).unwrap();
    assert!(
        warned.starts_with("2: warning: route_cookie: node-local sessions and no route cookie"),
        "{warned}"
    );
    let with_an_error = format!("{node_local}[limits]\nmax_body_bytes = 1\n{NODES}{DATA}");
    let problems = site(&with_an_error, Path::new(".")).unwrap_err();
    let heads: Vec<String> = problems
        .lines()
        .map(|l| l.splitn(3, ": ").take(2).collect::<Vec<_>>().join(": "))
        .collect();
    assert_eq!(heads, ["2: warning", "6: limits.max_body_bytes"]);
}

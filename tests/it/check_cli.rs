//! `moodle-gateway check` as an admin runs it: every problem of a broken file at once,
//! each with its line and key, and a non-zero exit; the resolved setup for a good one.

use std::path::Path;
use std::process::Command;

fn check(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["check", "--config"])
        .arg(config)
        .env_remove("MOODLE_GATEWAY_ADMIN_TOKEN")
        .env_remove("MOODLE_GATEWAY_ROUTE_SECRET")
        .env_remove("MOODLE_GATEWAY_STORE_SECRET")
        .env("RUST_LOG", "off")
        .output()
        .expect("the binary runs")
}

#[test]
fn every_broken_config_fixture_prints_exactly_its_expected_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/config");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "toml") {
            continue;
        }
        let relative = path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap();
        let expected = std::fs::read_to_string(path.with_extension("expected")).unwrap();
        let output = check(relative);
        assert_eq!(output.status.code(), Some(1), "{}", relative.display());
        assert_eq!(
            String::from_utf8_lossy(&output.stderr),
            expected,
            "{}",
            relative.display()
        );
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} broken configs");
}

#[test]
fn the_shipped_config_checks_clean_once_its_two_secrets_are_provided() {
    let output = Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["check", "--config", "config.toml"])
        .env(
            "MOODLE_GATEWAY_ADMIN_TOKEN",
            "a-long-admin-token-for-the-test-0123",
        )
        .env(
            "MOODLE_GATEWAY_ROUTE_SECRET",
            "a-route-secret-of-at-least-32-bytes-long",
        )
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("web4 http://192.168.1.4"), "{stdout}");
    assert!(
        stdout.contains("data server: data http://192.168.1.5"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("a-long-admin-token-for-the-test-0123"),
        "the token is never printed"
    );
    // The package's default is safe: a crash keeps every student on their node.
    assert!(
        stdout.contains(
            "route cookie: MoodleGatewayRoute (secret: set, from MOODLE_GATEWAY_ROUTE_SECRET)"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("a-route-secret-of"), "nor is the secret");
    assert_eq!(String::from_utf8_lossy(&output.stderr), "", "no warning");
}

/// A node-local site with no route cookie works, so `check` accepts it, but says
/// plainly whom a crash would log out and how to prevent it.
#[test]
fn check_warns_when_a_crash_would_log_out_students_of_a_node_local_site() {
    let dir = std::env::temp_dir().join(format!("mg-check-warn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = r#"
listen = "127.0.0.1:8080"
[session]
store = "node-local"
[offload]
url = "http://127.0.0.1:8081"
[[nodes]]
name = "web1"
url = "http://127.0.0.1:8001"
[data]
name = "data"
url = "http://127.0.0.1:8002"
"#;
    let write = |name: &str, extra: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{base}\n{extra}")).unwrap();
        path
    };
    let without = check(&write("without.toml", ""));
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert_eq!(without.status.code(), Some(0), "a warning, not a refusal");
    assert!(
        stderr.contains("warning: route_cookie: node-local sessions and no route cookie")
            && stderr.contains("logged out")
            && stderr.contains("[route_cookie] section with secret_file"),
        "{stderr}"
    );

    let with = write(
        "with.toml",
        "[route_cookie]\nsecret = \"a-route-secret-of-at-least-32-bytes-long\"",
    );
    let with = check(&with);
    let stderr = String::from_utf8_lossy(&with.stderr);
    assert_eq!(with.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr, "", "no warning");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_config_file_is_named() {
    let output = check(Path::new("no/such/config.toml"));
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no/such/config.toml"), "{stderr}");
}

/// The package's sandbox (`ProtectSystem=strict`) lets the gateway write only the
/// directories its unit names: the shipped config's spool must be one of them, and
/// private (mode 0700), or every spooled upload would fail at a deadline.
#[test]
fn the_shipped_spool_dir_is_the_units_private_cache_directory() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let unit = std::fs::read_to_string(root.join("debian/moodle-gateway.service")).unwrap();
    let setting = |name: &str| {
        let prefix = format!("{name}=");
        let line = unit.lines().find(|l| l.starts_with(&prefix));
        line.map(|l| l[prefix.len()..].to_owned())
    };
    let cache = setting("CacheDirectory").expect("the unit has a CacheDirectory=");
    assert_eq!(setting("CacheDirectoryMode").as_deref(), Some("0700"));
    let config = moodle_gateway::Config::load(&root.join("config.toml"));
    let spool_dir = match config {
        Ok(config) => config.limits.spool_dir,
        // The shipped admin token is not in the tree: read the key itself.
        Err(_) => {
            let text = std::fs::read_to_string(root.join("config.toml")).unwrap();
            let line = text
                .lines()
                .find(|l| l.starts_with("spool_dir = "))
                .unwrap();
            line["spool_dir = ".len()..].trim_matches('"').into()
        }
    };
    assert_eq!(spool_dir, Path::new("/var/cache").join(cache));
}

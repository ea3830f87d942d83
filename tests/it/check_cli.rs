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

/// A relative state file or access log starts from the directory `run` starts in:
/// `check` looks there too, and says which directory it looked in.
#[test]
fn a_relative_directory_that_is_missing_is_named_with_the_working_directory() {
    let dir = std::env::temp_dir().join(format!("mg-check-cwd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.toml");
    let text = r#"
[session]
store = "shared"
[state]
file = "state/moodle-gateway.state"
[[nodes]]
name = "web1"
url = "http://127.0.0.1:8001"
[data]
name = "data"
url = "http://127.0.0.1:8002"
"#;
    std::fs::write(&config, text).unwrap();
    let run_check = || {
        Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
            .current_dir(&dir)
            .args(["check", "--config", "config.toml"])
            .env("RUST_LOG", "off")
            .output()
            .unwrap()
    };
    let refused = run_check();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    let cwd = dir.canonicalize().unwrap();
    assert!(
        stderr.starts_with(&format!(
            "config.toml:5: state.file: directory state (relative to the working directory, {}) does not exist",
            cwd.display()
        )),
        "{stderr}"
    );
    std::fs::create_dir(dir.join("state")).unwrap();
    let accepted = run_check();
    assert_eq!(
        accepted.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// "Running it for real" quotes what `check` says of the shipped file before the
/// package has made its two secrets: the lines it names must be the file's.
#[test]
fn the_books_example_of_the_shipped_config_without_its_secrets_is_what_check_says() {
    let output = check(Path::new("config.toml"));
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let book = std::fs::read_to_string(root.join("docs/src/running-it-for-real.md")).unwrap();
    let quoted: Vec<&str> = book
        .split('`')
        .filter(|quote| quote.starts_with("config.toml:") && quote.contains("cannot read"))
        .collect();
    assert_eq!(quoted.len(), 2, "{quoted:?}");
    for line in quoted {
        assert!(
            stderr.lines().any(|l| l == line),
            "the book says {line:?}; check says:\n{stderr}"
        );
    }
}

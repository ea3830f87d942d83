//! The toolchain promise stays honest: Cargo.toml's `rust-version`, and README's
//! "Rust X or newer", are the highest `rust-version` in the locked dependency tree.
//!
//! Why computed rather than written down: `cargo +1.85 build --locked` once failed at
//! once (time 0.3.55 needs 1.88, via cookie) while README promised 1.85. A dependency
//! added or updated later (a metrics crate, a `cargo update`) raises the floor
//! silently; this test notices. Every package in the resolve counts, dependencies of
//! all kinds (normal, build and dev: `cargo test --locked` on the oldest toolchain
//! must work too) and for every platform, since the promise is not Linux-only.

use std::process::Command;

use serde_json::Value;

/// `1.88` and `1.88.0` alike, as comparable numbers.
fn version(text: &str) -> (u64, u64, u64) {
    let mut parts = text.split('.').map(|p| p.parse::<u64>().unwrap());
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["metadata", "--locked", "--format-version", "1"])
        .output()
        .expect("cargo metadata runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cargo metadata: {stderr}");
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn rust_version_is_the_highest_any_locked_dependency_needs_and_readme_says_so() {
    let metadata = metadata();
    let resolved: Vec<&str> = (metadata["resolve"]["nodes"].as_array().unwrap().iter())
        .map(|node| node["id"].as_str().unwrap())
        .collect();
    let packages = metadata["packages"].as_array().unwrap();
    let ours = packages
        .iter()
        .find(|p| p["name"] == "moodle-gateway")
        .unwrap();
    let needed = (packages.iter())
        .filter(|p| resolved.contains(&p["id"].as_str().unwrap()) && p["name"] != "moodle-gateway")
        .filter_map(|p| Some((version(p["rust_version"].as_str()?), p["name"].as_str()?)))
        .max()
        .expect("some dependency states a rust-version");
    let declared = ours["rust_version"]
        .as_str()
        .expect("Cargo.toml sets rust-version");
    assert_eq!(
        version(declared),
        needed.0,
        "Cargo.toml's rust-version is {declared}; {} needs {:?}",
        needed.1,
        needed.0
    );
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"));
    let promise = format!("Rust {declared} or newer");
    assert!(
        readme.unwrap().contains(&promise),
        "README must say {promise:?}"
    );
}

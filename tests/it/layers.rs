//! The library's modules only point down: each top-level module imports only
//! modules of a lower layer, so no two of them import each other and a newcomer can
//! read the tree from the bottom up. The layers are the architecture of the crate's
//! `Layout` doc (src/lib.rs); this test is what keeps it true when someone adds a
//! `use crate::…` in a hurry.

use std::collections::BTreeSet;
use std::path::Path;

/// Bottom to top. A module may import any module of a lower layer, never one of
/// its own layer or above.
const LAYERS: &[&[&str]] = &[
    // Facts and words every other module shares, importing nothing of the crate.
    &["node_id", "moodle", "logs", "error", "clock"],
    &["config"],
    // Bytes in and out.
    &["http"],
    // The access log's thread (its body passes a splice on, see `http::splice`), the
    // nodes (which own their keep-alive connections), and the file limit.
    &["access_log", "cluster", "open_files", "ready"],
    // What is counted, and the session table: each knows a node by its id only.
    &["metrics", "sessions"],
    // Several gateways, one truth.
    &["store"],
    // One request's journey, where the wings meet.
    &["gateway"],
    // The admin API, and the doctor, which asks the nodes as the gateway would.
    &["admin", "doctor"],
    &["app"],
    // The whole gateway in front of stand-in nodes.
    &["demo", "handover"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The modules behind lib.rs's `pub use module::…::Name;` (`crate::App`).
fn reexports(lib: &str) -> Vec<(String, String)> {
    let uses = lib
        .lines()
        .filter_map(|line| line.strip_prefix("pub use ")?.strip_suffix(';'));
    uses.filter_map(|path| {
        let (module, _) = path.split_once("::")?;
        let name = path.rsplit("::").next()?;
        Some((name.to_owned(), module.to_owned()))
    })
    .collect()
}

/// Every `crate::name` a file's code (not its comments) refers to.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        for (at, _) in line.match_indices("crate::") {
            let rest = &line[at + "crate::".len()..];
            let name: String = (rest.chars())
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `$crate::` is a macro's path to wherever the macro is defined.
            let before = line[..at].chars().next_back();
            if !name.is_empty() && before.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '$') {
                found.insert(name);
            }
        }
    }
    found
}

fn rust_files(dir: &Path, into: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

#[test]
fn every_module_imports_only_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let reexported = reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(!reexported.is_empty(), "lib.rs re-exports App and Config");
    let mut upward = Vec::new();
    let mut checked = 0;
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative.components().next().unwrap().as_os_str();
        let module = top.to_str().unwrap().trim_end_matches(".rs");
        // The binary (main.rs, cli.rs) and lib.rs sit above the library's modules.
        if ["main", "cli", "lib"].contains(&module) {
            continue;
        }
        let Some(own) = layer(module) else {
            panic!("src/{module} is in no layer of LAYERS: place it there");
        };
        let code = std::fs::read_to_string(&file).unwrap();
        for imported in imports(&code) {
            checked += 1;
            let imported = match reexported.iter().find(|(name, _)| *name == imported) {
                Some((_, module)) => module.clone(),
                None => imported,
            };
            let theirs = layer(&imported);
            if imported != module && theirs.is_none_or(|theirs| theirs >= own) {
                upward.push(format!("{} imports crate::{imported}", relative.display()));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} imports found: is the scan broken?"
    );
    assert!(
        upward.is_empty(),
        "imports that do not point down:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_scan_sees_code_and_skips_comments() {
    let code = "use crate::cluster::upstreams::Upstreams;\n\
                // crate::admin in a comment\n\
                let x = crate::metrics::Meters::new(); // and crate::app\n\
                $crate::logs::say!();";
    let found: Vec<String> = imports(code).into_iter().collect();
    assert_eq!(found, ["cluster", "metrics"]);
}

//! The library's modules only point down: each top-level module imports only
//! modules of a lower layer, so no two of them import each other and a newcomer can
//! read the tree from the bottom up. The layers are the architecture of the crate's
//! `Layout` doc (src/lib.rs); this test is what keeps it true when someone adds a
//! `use crate::…` in a hurry. Inside `http/` its folders keep the same rule
//! ([`HTTP_LAYERS`]), so the largest wing has no import cycle either.

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
    // The access log's thread (its body passes a splice on, see `http::body::splice`), the
    // nodes (which own their keep-alive connections), and the file limit.
    &["access_log", "cluster", "open_files", "ready"],
    // What is counted, and the session table: each knows a node by its id only.
    &["metrics", "sessions"],
    // Several gateways, one truth.
    &["store"],
    // Certificates from a CA (config, http, metrics), one for the site (store).
    &["acme"],
    // One request's journey, where the wings meet.
    &["gateway"],
    // The admin API, and the doctor, which asks the nodes as the gateway would.
    &["admin", "doctor"],
    &["app"],
    // The whole gateway in front of stand-in nodes.
    &["demo", "handover"],
];

/// The folders of `http/`, bottom to top, under the same rule: a folder imports only
/// folders of a lower rank, so `http/` holds no import cycle. The two sides of a
/// gateway share a rank: the students' (`accept`) and the nodes' (`upstream`) both
/// stand on HTTP/1.1 (`h1`) and the bodies (`body`), and only `gateway` joins them.
const HTTP_LAYERS: &[&[&str]] = &[
    // Bodies in motion and every pause they may take; a body on disk.
    &["body"],
    // HTTP/1.1 on the wire, the students' side and the nodes'.
    &["h1"],
    // Where a connection begins, and where a request leaves for a node.
    &["accept", "upstream"],
];

fn layer(module: &str) -> Option<usize> {
    rank(LAYERS, module)
}

fn rank(layers: &[&[&str]], name: &str) -> Option<usize> {
    layers.iter().position(|layer| layer.contains(&name))
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
    imports_under(code, "crate::")
}

/// Every `{prefix}name` a file's code (not its comments) refers to.
fn imports_under(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        for (at, _) in line.match_indices(prefix) {
            let rest = &line[at + prefix.len()..];
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

/// An import from one folder of `http/` to another that does not point down, for a
/// file at `relative` (under `src/http/`) with `code`.
fn http_upward(relative: &Path, code: &str) -> Vec<String> {
    let mut parts = relative.components();
    let folder = parts.next().unwrap().as_os_str().to_str().unwrap();
    if parts.next().is_none() {
        // http/mod.rs sits above its folders.
        return Vec::new();
    }
    let Some(own) = rank(HTTP_LAYERS, folder) else {
        return vec![format!(
            "src/http/{folder} is in no rank of HTTP_LAYERS: place it there"
        )];
    };
    let mut upward = Vec::new();
    // Folders name each other by `crate::http::`; `super::super::` would hide one.
    if code.contains("super::super::") {
        upward.push(format!(
            "src/http/{} climbs with super::super::",
            relative.display()
        ));
    }
    for imported in imports_under(code, "crate::http::") {
        let theirs = rank(HTTP_LAYERS, &imported);
        if imported != folder && theirs.is_none_or(|theirs| theirs >= own) {
            upward.push(format!(
                "src/http/{} imports crate::http::{imported}",
                relative.display()
            ));
        }
    }
    upward
}

#[test]
fn every_folder_of_http_imports_only_folders_below_it() {
    let http = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut files = Vec::new();
    rust_files(&http, &mut files);
    let mut upward = Vec::new();
    let mut checked = 0;
    for file in files {
        let relative = file.strip_prefix(&http).unwrap();
        let code = std::fs::read_to_string(&file).unwrap();
        checked += imports_under(&code, "crate::http::").len();
        upward.extend(http_upward(relative, &code));
    }
    assert!(
        checked > 25,
        "only {checked} imports found: is the scan broken?"
    );
    assert!(
        upward.is_empty(),
        "imports inside http/ that do not point down:\n{}",
        upward.join("\n")
    );
}

#[test]
fn a_cycle_between_two_folders_of_http_is_found() {
    // h1 below upstream: the nodes' side may use the wire, never the other way.
    let down = "use crate::http::h1::client::Connection;";
    let up = "use crate::http::upstream::upload::Upload;";
    assert!(http_upward(Path::new("upstream/pool.rs"), down).is_empty());
    assert_eq!(
        http_upward(Path::new("h1/client.rs"), up),
        ["src/http/h1/client.rs imports crate::http::upstream"]
    );
    // The two sides share a rank, so neither may import the other.
    let side = "let x = crate::http::accept::edge::EdgeRules::new(a, b);";
    assert_eq!(http_upward(Path::new("upstream/proxy.rs"), side).len(), 1);
    assert_eq!(
        http_upward(Path::new("h1/wire.rs"), "super::super::body::X").len(),
        1
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

//! The book's module map (`docs/src/layout.md`, "Module map") names every module
//! of `src/`, and names none that is gone: a reader who looks a module up finds
//! it, and a move or a new file that forgets the map fails here, not months later.
//! A module counts as named when its path appears in backticks in the map's table,
//! as a row of its own or inside a parent's row.

use std::collections::BTreeSet;
use std::path::Path;

/// Every module path of the library (`a::b::c`), from its files: `a.rs`,
/// `a/mod.rs` and `a/b.rs` alike. Test modules, fuzz entry points and the binary's
/// `main` are not part of the map.
fn modules(dir: &Path, prefix: &str, into: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            modules(&path, &join(prefix, &name), into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            if ["mod", "lib", "main"].contains(&name.as_str()) {
                continue;
            }
            if name == "tests"
                || name.ends_with("_tests")
                || name == "fuzzing"
                || prefix.ends_with("tests")
            {
                continue;
            }
            into.insert(join(prefix, &name));
        }
    }
}

fn join(prefix: &str, name: &str) -> String {
    match prefix {
        "" => name.to_owned(),
        _ => format!("{prefix}::{name}"),
    }
}

/// The table's text: from "| module | owns |" to the next heading.
fn map_table(book: &str) -> &str {
    let start = book
        .find("| module | owns |")
        .expect("the module map's table");
    let rest = &book[start..];
    &rest[..rest.find("\n#").unwrap_or(rest.len())]
}

/// Every `a::b` (or single word) in backticks in `text`.
fn named(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_books_module_map_names_every_module_and_no_module_that_is_gone() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = BTreeSet::new();
    modules(&root.join("src"), "", &mut files);
    // A folder is a module too, whether or not it has a mod.rs.
    let folders: BTreeSet<String> = files
        .iter()
        .flat_map(|m| {
            let parts: Vec<&str> = m.split("::").collect();
            (1..parts.len()).map(move |n| parts[..n].join("::"))
        })
        .collect();
    let book = std::fs::read_to_string(root.join("docs/src/layout.md")).unwrap();
    let table = map_table(&book);
    let in_map = named(table);
    let missing: Vec<_> = files.iter().filter(|m| !in_map.contains(*m)).collect();
    assert!(
        missing.is_empty(),
        "modules of src/ the map in docs/src/layout.md does not name: {missing:?}"
    );
    let rows: Vec<&str> = table
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split('`').next())
        .collect();
    let gone: Vec<_> = rows
        .iter()
        .filter(|m| !files.contains(**m) && !folders.contains(**m))
        .collect();
    assert!(
        gone.is_empty(),
        "rows of the map for modules not in src/: {gone:?}"
    );
}

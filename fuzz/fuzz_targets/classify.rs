//! `Site::classify` on arbitrary request targets, at the host root and under a sub-path.
//!
//! Beyond "never panics": a redundant `./` or `//` (which the classifier resolves, as the
//! web server does) never changes the verdict, and a raw `%2F` in the path is always refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moodle_gateway::moodle::{AmbiguousPath, Site};

fuzz_target!(|data: &[u8]| {
    let target = String::from_utf8_lossy(data);
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (&*target, None),
    };
    for site in [
        Site::new("", "MoodleSession", "/"),
        Site::new("/moodle", "MoodleSession", "/moodle/"),
    ] {
        let kind = site.classify(path, query);
        if path.to_ascii_lowercase().contains("%2f") {
            assert_eq!(kind, Err(AmbiguousPath), "{path:?}");
        }
        if path.starts_with('/') {
            for redundant in ["/./", "//"] {
                let longer = path.replacen('/', redundant, 1);
                assert_eq!(
                    site.classify(&longer, query),
                    kind,
                    "{path:?} vs {longer:?}"
                );
            }
        }
    }
});

//! The man pages build.rs writes, read as `man` would show them: a NAME short enough
//! for `whatis`, an EXIT STATUS and EXAMPLES on every page, every variable the gateway
//! reads under ENVIRONMENT, and no heading with nothing under it. (`tests/package.sh`
//! also runs `lexgrog` and `man --warnings` on the installed pages.)

use moodle_gateway::config::{
    ADMIN_TOKEN_ENV, MASTER_PASSWORD_ENV, ROUTE_SECRET_ENV, SENTINEL_PASSWORD_ENV, STORE_SECRET_ENV,
};

/// Every page, as (name, roff source).
fn pages() -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("OUT_DIR"));
    let mut pages: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "1"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).unwrap())
        })
        .collect();
    pages.sort();
    pages
}

/// The page's sections, as (heading, the lines of text under it): roff requests
/// (`.TP`, `.ie`, ...) are not text.
fn sections(roff: &str) -> Vec<(String, Vec<String>)> {
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for line in roff.lines() {
        if let Some(heading) = line.strip_prefix(".SH ") {
            sections.push((heading.trim_matches('"').to_owned(), Vec::new()));
        } else if let Some((_, text)) = sections.last_mut() {
            if !line.starts_with('.') && !line.trim().is_empty() {
                text.push(line.to_owned());
            }
        }
    }
    sections
}

fn section<'a>(sections: &'a [(String, Vec<String>)], heading: &str) -> Option<&'a [String]> {
    sections
        .iter()
        .find(|(h, _)| h == heading)
        .map(|(_, text)| text.as_slice())
}

#[test]
fn there_is_a_page_for_the_gateway_and_one_for_each_command() {
    let names: Vec<String> = pages().into_iter().map(|(name, _)| name).collect();
    assert_eq!(
        names,
        [
            "moodle-gateway",
            "moodle-gateway-check",
            "moodle-gateway-demo",
            "moodle-gateway-doctor",
            "moodle-gateway-help",
            "moodle-gateway-ready",
            "moodle-gateway-run",
        ]
    );
}

#[test]
fn every_page_has_a_short_name_line_and_no_empty_heading() {
    for (name, roff) in pages() {
        let sections = sections(&roff);
        let name_line = section(&sections, "NAME").unwrap_or_else(|| panic!("{name}: no NAME"));
        assert_eq!(
            name_line.len(),
            1,
            "{name}: NAME is one line: {name_line:?}"
        );
        let (page, what) = name_line[0].split_once(" \\- ").expect("name \\- what");
        assert_eq!(page.replace("\\-", "-"), name);
        assert!(
            what.len() <= 70,
            "{name}: NAME is a few words, not {what:?}"
        );
        let description = section(&sections, "DESCRIPTION").unwrap_or_default();
        assert!(
            description.join(" ").len() > what.len(),
            "{name}: the DESCRIPTION says more than the NAME: {description:?}"
        );
        for (heading, text) in &sections {
            assert!(!text.is_empty(), "{name}: {heading} is an empty heading");
        }
    }
}

#[test]
fn every_page_says_its_exit_status_and_gives_examples() {
    for (name, roff) in pages() {
        let sections = sections(&roff);
        let status = section(&sections, "EXIT STATUS").unwrap_or_else(|| panic!("{name}"));
        assert!(
            status.iter().any(|l| l == "\\fB0\\fR"),
            "{name}: {status:?}"
        );
        assert!(
            section(&sections, "EXAMPLES").is_some(),
            "{name}: no EXAMPLES"
        );
    }
    let doctor = pages()
        .into_iter()
        .find(|(name, _)| name == "moodle-gateway-doctor")
        .unwrap()
        .1;
    let sections = sections(&doctor);
    let status = section(&sections, "EXIT STATUS").unwrap();
    for code in ["0", "1", "2"] {
        assert!(
            status.contains(&format!("\\fB{code}\\fR")),
            "doctor's exit status {code}: {status:?}"
        );
    }
}

#[test]
fn the_pages_of_commands_that_read_the_config_name_every_variable_it_reads() {
    let wanted = [
        ADMIN_TOKEN_ENV,
        ROUTE_SECRET_ENV,
        STORE_SECRET_ENV,
        MASTER_PASSWORD_ENV,
        SENTINEL_PASSWORD_ENV,
        "MOODLE_GATEWAY_DOCTOR_PASSWORD",
        "RUST_LOG",
        "TOKIO_WORKER_THREADS",
    ];
    for (name, roff) in pages() {
        if name == "moodle-gateway-help" {
            continue;
        }
        let sections = sections(&roff);
        let environment = section(&sections, "ENVIRONMENT")
            .unwrap_or_else(|| panic!("{name}: no ENVIRONMENT"))
            .join("\n");
        for variable in wanted {
            assert!(
                environment.contains(&format!("\\fB{variable}\\fR")),
                "{name}: ENVIRONMENT lacks {variable}"
            );
        }
    }
}

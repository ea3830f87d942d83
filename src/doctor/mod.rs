//! `moodle-gateway doctor`: asks the live site, node by node, the questions a Moodle
//! expert would ask of a cluster, and names the `config.php` line or gateway key that
//! fixes each problem it finds. `check` judges the gateway's own file; most failed
//! Moodle clusters fail in `config.php` instead (one node with another wwwroot, a
//! missing `sslproxy`, sessions believed shared that are not), and only the nodes'
//! answers show it.
//!
//! It is polite to a live site: a handful of requests per node, never two at once to
//! one node, nothing written beyond the test account's login and logout. Every
//! visitor of a Moodle page gets a not-logged-in session (so does the visitor a logout
//! leaves behind): the doctor makes one per node and reuses it, and Moodle's session
//! cleanup removes those. Reading pages lives in [`crate::moodle::pages`]; this wing
//! only asks and judges. It imports `config` and `moodle`, nothing of the proxy.

mod ask;
mod checks;

use std::fmt::Write as _;

use serde::Serialize;

use crate::config::Config;

/// What the doctor was asked to do besides looking.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A test account to log in with on each node (and out again).
    pub login: Option<Login>,
    /// A file (path and query under wwwroot) the test account may read, to prove the
    /// offload end to end; without it the doctor looks for one in the account's courses.
    pub file: Option<String>,
}

/// A test account. The password never comes from the command line (it would show
/// in `ps` and in shell history).
#[derive(Clone)]
pub struct Login {
    /// The account's Moodle username.
    pub username: String,
    /// Its password, kept out of `Debug`.
    pub password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// One problem: where, what was seen, why students suffer, and what fixes it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Finding {
    /// The node (`web1`), `data`, `export`, or `site` for the site as a whole.
    pub node: String,
    /// The setting at fault: a `config.php` `$CFG` name or a gateway key.
    pub setting: String,
    /// What the node answered: status, header, value.
    pub saw: String,
    /// What it does to students.
    pub why: String,
    /// The exact line or key that fixes it.
    pub fix: String,
}

/// What the doctor saw of one node, problem or not.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Seen {
    /// The node's name in the gateway's config (`data`, `export` for those two).
    pub node: String,
    /// Its address, as the gateway reaches it.
    pub address: String,
    /// Whether it answered at all.
    pub reached: bool,
    /// What the health probe got.
    pub health: String,
    /// What the login page got.
    pub login_page: String,
    /// `M.cfg.wwwroot` on the login page.
    pub wwwroot: String,
    /// The theme, JavaScript and template revisions its login page links.
    pub revisions: Option<crate::moodle::Revisions>,
    /// The node's `Date` minus the gateway's clock, in seconds.
    pub clock_offset_secs: Option<i64>,
    /// Whether it read a session another node started: `shared`, `own`, or "".
    pub sessions: String,
    /// What its low-priority pool's login page got ("" without `low_priority_url`).
    pub low_priority: String,
}

/// Everything the doctor learned.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// The gateway's wwwroot, which every node was asked as.
    pub wwwroot: String,
    /// Each node, the data server and the export, as seen.
    pub nodes: Vec<Seen>,
    /// The problems, in the order found.
    pub findings: Vec<Finding>,
    /// What it could not check, and why (a missing `--login`, say).
    pub unchecked: Vec<String>,
    /// Why it could not ask at all.
    pub cannot_ask: Option<String>,
}

impl Report {
    /// 0 when it found no problem, 1 when it found one, 2 when it could not ask.
    pub fn exit_code(&self) -> u8 {
        if self.cannot_ask.is_some() || !self.nodes.iter().any(|n| n.reached) {
            2
        } else if self.findings.is_empty() {
            0
        } else {
            1
        }
    }

    /// The report for a terminal: what each node showed, then each problem.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if let Some(why) = &self.cannot_ask {
            let _ = writeln!(out, "doctor: cannot ask the site: {why}");
            return out;
        }
        let _ = writeln!(out, "doctor: the site at {}", self.wwwroot);
        for seen in &self.nodes {
            let _ = write!(out, "  {:<8} {:<22} ", seen.node, seen.address);
            if !seen.reached {
                let _ = writeln!(out, "not reached: {}", seen.health);
                continue;
            }
            let _ = write!(
                out,
                "health {} · login page {}",
                seen.health, seen.login_page
            );
            if let Some(revisions) = &seen.revisions {
                let _ = write!(
                    out,
                    " · revisions {}/{}/{}",
                    revisions.themerev, revisions.jsrev, revisions.templaterev
                );
            }
            if let Some(offset) = seen.clock_offset_secs {
                let _ = write!(out, " · clock {offset:+} s");
            }
            if !seen.sessions.is_empty() {
                let _ = write!(out, " · sessions {}", seen.sessions);
            }
            if !seen.low_priority.is_empty() {
                let _ = write!(out, " · low-priority pool {}", seen.low_priority);
            }
            out.push('\n');
        }
        for line in &self.unchecked {
            let _ = writeln!(out, "  not checked: {line}");
        }
        match self.findings.len() {
            0 => {
                let _ = writeln!(out, "no problem found");
            }
            n => {
                let _ = writeln!(out, "{n} problem{}:", if n == 1 { "" } else { "s" });
                for finding in &self.findings {
                    let _ = writeln!(out, "\n{}: {}", finding.node, finding.setting);
                    let _ = writeln!(out, "  saw: {}", finding.saw);
                    let _ = writeln!(out, "  why: {}", finding.why);
                    let _ = writeln!(out, "  fix: {}", finding.fix);
                }
            }
        }
        out
    }

    /// The report for scripts.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".into())
    }
}

/// Examines the site behind `config`.
pub async fn examine(config: &Config, options: &Options) -> Report {
    checks::examine(config, options).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(reached: bool) -> Seen {
        Seen {
            node: "web1".into(),
            reached,
            ..Seen::default()
        }
    }

    #[test]
    fn the_exit_code_says_healthy_problem_or_could_not_ask() {
        let mut report = Report {
            nodes: vec![seen(true)],
            ..Report::default()
        };
        assert_eq!(report.exit_code(), 0);
        report.findings.push(Finding {
            node: "web1".into(),
            setting: "$CFG->wwwroot".into(),
            saw: "303".into(),
            why: "w".into(),
            fix: "f".into(),
        });
        assert_eq!(report.exit_code(), 1);
        report.nodes = vec![seen(false)];
        assert_eq!(report.exit_code(), 2, "no node reached");
    }

    #[test]
    fn the_password_never_shows_in_debug_output() {
        let login = Login {
            username: "teacher".into(),
            password: "s3cret".into(),
        };
        assert!(!format!("{login:?}").contains("s3cret"));
    }
}

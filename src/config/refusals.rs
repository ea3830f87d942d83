//! What a file can say that parses but cannot work in front of a real Moodle site:
//! settings that would log students out or take the site down the moment students
//! arrive. `check` refuses such a file, each refusal naming its key and line, what
//! Moodle would do, and the way out, in one list with the file's other errors; `run`
//! logs the same lines as errors and starts anyway (a site with no SCORM activity
//! may live with node-local sessions).
//!
//! Beside them, [`warnings`](Config::warnings): settings that work, but cost
//! students their login on a day that will come (a crash), which `check` and `run`
//! say plainly without refusing the file.
//!
//! Kept apart from [`Config::parse`](super::Config::parse), which checks that each
//! value is well-formed: these rules judge values together, against Moodle's own
//! behaviour (the book's "Moodle behind a proxy", docs/src/moodle.md, as seen on a real
//! Moodle 4.5 by the real-Moodle suite) and against the machine `check` runs on
//! (`directories`), and tests that run stand-in nodes (which are not Moodle) build
//! configs these rules would refuse.

use std::path::Path;

use super::values::format_size;
use super::{
    read, Checker, Config, ConfigEnv, ConfigError, ConfigErrors, SessionStore, Severity,
    StoreConfig,
};
use crate::moodle::{RequestKind, Site, SMALLEST_UPLOAD_LIMIT};

/// A rule judged on the whole config, and the keys (or sections) it reads. While
/// one of them has an error of its own, its value is a default standing in for what
/// the admin wrote, so the rule is not judged: it would blame the stand-in.
struct Rule {
    reads: &'static [&'static str],
    judge: fn(&Config) -> Option<ConfigError>,
}

/// What `check` refuses.
const REFUSALS: [Rule; 8] = [
    Rule {
        reads: &["session.store", "offload", "data"],
        judge: Config::scorm_needs_the_session,
    },
    Rule {
        reads: &["site", "listen", "trusted_proxies"],
        judge: Config::wwwroot_port_is_not_ours,
    },
    Rule {
        reads: &["site", "tls"],
        judge: Config::tls_under_an_http_wwwroot,
    },
    Rule {
        reads: &[
            "health.path",
            "site",
            "session.cookie",
            "session.cookie_path",
        ],
        judge: Config::probe_starts_sessions,
    },
    Rule {
        reads: &[
            "session.store",
            "session.logged_in_idle",
            "session.sessiontimeout",
        ],
        judge: Config::forgets_sessions_moodle_keeps,
    },
    Rule {
        reads: &["limits.max_body_bytes"],
        judge: Config::body_limit_refuses_forms,
    },
    Rule {
        reads: &["state.file", "session.store"],
        judge: Config::state_directory_missing,
    },
    Rule {
        reads: &["access_log.to"],
        judge: Config::access_log_directory_missing,
    },
];

/// What `check` says without refusing the file.
const WARNINGS: [Rule; 1] = [Rule {
    reads: &["session.store", "store", "route_cookie", "state"],
    judge: Config::crash_forgets_logins,
}];

impl Config {
    /// What `check` reads: [`Config::load`] with every rule of this file judged in
    /// the same pass. `Ok` holds the config and its warnings; `Err` every error and
    /// warning of the file, by line.
    pub fn load_for_site(path: &Path) -> Result<(Config, ConfigErrors), ConfigErrors> {
        let source = path.display().to_string();
        let (text, base_dir) = read(path)?;
        match Config::parse_for_site(&text, base_dir, ConfigEnv::from_process()) {
            Ok((config, warnings)) => Ok((config, warnings.with_source(source))),
            Err(problems) => Err(problems.with_source(source)),
        }
    }

    /// [`Config::parse`], then the refusals and warnings, all in one list: an admin
    /// who fixes a typo does not then meet a refusal the typo hid.
    pub fn parse_for_site(
        text: &str,
        base_dir: &Path,
        env: ConfigEnv,
    ) -> Result<(Config, ConfigErrors), ConfigErrors> {
        let (doc, mut c) = Checker::start(text, base_dir, env)?;
        let config = c.config(doc.get_ref());
        let mut problems = std::mem::take(&mut c.errors);
        if let Some(config) = &config {
            problems.extend(config.judged(&problems));
        }
        let refused = problems.iter().any(|p| p.severity == Severity::Error);
        let problems = ConfigErrors::sorted(problems);
        match config {
            Some(config) if !refused => Ok((config, problems)),
            _ => Err(problems),
        }
    }

    /// Every reason this config cannot work on a real Moodle site; empty when it can.
    pub fn refusals(&self) -> Vec<ConfigError> {
        REFUSALS.iter().filter_map(|r| (r.judge)(self)).collect()
    }

    /// What works today but logs students out on a bad day; empty when nothing does.
    pub fn warnings(&self) -> Vec<ConfigError> {
        WARNINGS
            .iter()
            .filter_map(|r| (r.judge)(self))
            .map(warning)
            .collect()
    }

    /// The refusals and warnings whose keys have no error among `problems`.
    fn judged(&self, problems: &[ConfigError]) -> Vec<ConfigError> {
        let clean = |rule: &&Rule| {
            let read = |p: &ConfigError| rule.reads.iter().any(|key| within(&p.key, key));
            !problems.iter().any(read)
        };
        let warnings = WARNINGS
            .iter()
            .filter(clean)
            .filter_map(|r| (r.judge)(self));
        REFUSALS
            .iter()
            .filter(clean)
            .filter_map(|r| (r.judge)(self))
            .chain(warnings.map(warning))
            .collect()
    }

    /// SCORM files go to the data server, which serves them only after
    /// `require_login()`: with node-local sessions it holds no student's session, so
    /// Moodle 4.5 answers every SCORM file with a 303 to the login page and a new
    /// session cookie, and the student is logged out (140 of 140 students, seen).
    fn scorm_needs_the_session(&self) -> Option<ConfigError> {
        let scorm_on_data = self.offload.is_none();
        (self.session.store == SessionStore::NodeLocal && scorm_on_data).then(|| {
            self.lines.error(
                &["session.store", "session", "data"],
                format!(
                    "node-local sessions with SCORM files sent to the data server ({}) log \
                     every student out at their first SCORM file: the data server cannot \
                     read a session another node holds, so Moodle answers with a redirect to \
                     the login page and a new session id. Two ways out: keep sessions in a \
                     store every node and the data server share (Redis, memcached, or file \
                     sessions on the shared dataroot) and set store = \"shared\"; or let \
                     each student's own node authorise the file and the data server send \
                     only the bytes: an [offload] section naming the data server's file \
                     export, with $CFG->xsendfile = 'X-Accel-Redirect' on the nodes",
                    self.data.name
                ),
            )
        })
    }

    /// A logged-in entry the gateway forgets while Moodle still honours the session
    /// sends the student's next request to a freshly dealt node: with node-local
    /// sessions, a logout the session-loss detector cannot even see (the id is
    /// unknown by then).
    fn forgets_sessions_moodle_keeps(&self) -> Option<ConfigError> {
        let s = &self.session;
        let short = s.store == SessionStore::NodeLocal && s.logged_in_idle < s.sessiontimeout;
        short.then(|| {
            let d = |d| humantime::format_duration(d).to_string();
            self.lines.error(
                &[
                    "session.logged_in_idle",
                    "session.sessiontimeout",
                    "session",
                ],
                format!(
                    "{} is shorter than session.sessiontimeout ({}): the gateway would forget a \
                     logged-in session Moodle still honours, and with node-local sessions the \
                     student's next request after a long pause lands on another node and is \
                     logged out. Set logged_in_idle to sessiontimeout plus some slack (like \
                     \"{}\"), or sessiontimeout to $CFG->sessiontimeout if it is shorter",
                    d(s.logged_in_idle),
                    d(s.sessiontimeout),
                    d(s.sessiontimeout + std::time::Duration::from_secs(1800)),
                ),
            )
        })
    }

    /// Moodle compares wwwroot's port with each node's `$_SERVER['SERVER_PORT']` and
    /// redirects to wwwroot when they differ. A wwwroot that names a port students
    /// connect to, on a gateway listening on another one with nothing in front of
    /// it, is a typo: students would never reach the site.
    fn wwwroot_port_is_not_ours(&self) -> Option<ConfigError> {
        let wwwroot = self.site.wwwroot.as_ref()?;
        let port = wwwroot.port?;
        let ours = self.listen.port();
        // A proxy in front of the gateway may well listen on wwwroot's port.
        if port == ours || !self.trusted_proxies.is_empty() {
            return None;
        }
        Some(self.lines.error(
            &["site.wwwroot"],
            format!(
                "{} names port {port}, but the gateway listens on {ours}: students use \
                 wwwroot's port, and Moodle redirects every request whose node reports \
                 another SERVER_PORT to wwwroot. Listen on {port}, or take the port out of \
                 wwwroot (and of $CFG->wwwroot) and let the nodes report the default port",
                wwwroot.url
            ),
        ))
    }

    /// A probe runs every `interval` on every node: one that reaches a script that
    /// starts a session writes a session row each time, forever.
    fn probe_starts_sessions(&self) -> Option<ConfigError> {
        let site = Site::new(
            &self.site.path,
            &self.session.cookie,
            &self.session.cookie_path,
        );
        let (path, query) = match self.health.path.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (self.health.path.as_str(), None),
        };
        match site.classify(path, query) {
            Ok(RequestKind::Sessionless) => None,
            _ => Some(self.lines.error(
                &["health.path"],
                format!(
                    "{:?} runs a Moodle script that starts a session: each probe would \
                     create a session row on every node every health.interval. Probe a \
                     script that starts none: the default (leave path out), or \
                     tool_heartbeat's \"{}/admin/tool/heartbeat/\"",
                    self.health.path, self.site.path
                ),
            )),
        }
    }

    /// With node-local sessions, a binding the gateway forgets is a logout: the node
    /// that holds the session sets no new cookie, so the gateway cannot relearn it,
    /// and the next node it deals starts a new session. The snapshot is written every
    /// `save_every`, so a gateway that is killed (crash, OOM killer, `kill -9`) loses
    /// the logins since the last one; measured: 4 of 8 students logged out after a
    /// `kill -9` right after their logins. The route cookie, or a shared store that
    /// holds every binding, keeps them.
    fn crash_forgets_logins(&self) -> Option<ConfigError> {
        let alone = matches!(self.store, StoreConfig::Memory);
        let at_risk = self.session.store == SessionStore::NodeLocal && alone;
        (at_risk && self.route_cookie.is_none()).then(|| {
            let since = match &self.state.file {
                Some(_) => format!(
                    "the students who logged in since its last snapshot (state.save_every, {})",
                    humantime::format_duration(self.state.save_every)
                ),
                None => "every student (there is no state.file either)".to_owned(),
            };
            self.lines.error(
                &["route_cookie", "session.store", "session"],
                format!(
                    "node-local sessions and no route cookie: if this gateway is killed (a \
                     crash, the OOM killer, kill -9), {since} are sent to another node and \
                     logged out. Add a [route_cookie] section with secret_file (the Debian \
                     package makes /etc/moodle-gateway/route.secret), or share the table \
                     through [store] kind = \"redis\""
                ),
            )
        })
    }

    /// Students reach a gateway with `[tls]` over HTTPS, but Moodle builds every link,
    /// form action and redirect from wwwroot: with `http://` there, browsers block the
    /// page's scripts as mixed content and send each form, the login first, back to
    /// plain HTTP, which is the redirect listener's (sent back to HTTPS, the POST lost)
    /// or nobody's.
    fn tls_under_an_http_wwwroot(&self) -> Option<ConfigError> {
        let wwwroot = self.site.wwwroot.as_ref().filter(|w| !w.https)?;
        self.tls.as_ref()?;
        Some(self.lines.error(
            &["site.wwwroot", "tls"],
            format!(
                "{} is plain HTTP, but [tls] makes the gateway speak HTTPS on {}: Moodle \
                 writes every link, form and redirect with wwwroot's http://, so browsers \
                 block the pages' scripts and send every form, the login first, to plain \
                 HTTP, and no student can log in. Write https:// in site.wwwroot and in \
                 $CFG->wwwroot on every node and the data server, with $CFG->sslproxy = \
                 true; or remove [tls] if a proxy in front of the gateway speaks HTTPS",
                wwwroot.url, self.listen
            ),
        ))
    }

    /// A body limit below anything Moodle itself would accept refuses a login form
    /// (a few hundred bytes) with 413 before Moodle sees it.
    fn body_limit_refuses_forms(&self) -> Option<ConfigError> {
        let limit = self.limits.max_body_bytes;
        (limit < SMALLEST_UPLOAD_LIMIT).then(|| {
            self.lines.error(
                &["limits.max_body_bytes"],
                format!(
                    "{} is below {}, the smallest upload limit Moodle offers: every larger \
                     request body (a login form, a forum post, a quiz page, any upload) would \
                     be refused with 413 before it reaches Moodle. Set it to PHP's \
                     post_max_size (8MiB unless php.ini says otherwise)",
                    format_size(limit),
                    format_size(SMALLEST_UPLOAD_LIMIT)
                ),
            )
        })
    }
}

/// Whether a problem about `key` is about `section` or a key under it.
fn within(key: &str, section: &str) -> bool {
    key.strip_prefix(section)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

fn warning(mut problem: ConfigError) -> ConfigError {
    problem.severity = Severity::Warning;
    problem
}

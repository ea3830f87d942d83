//! What a file can say that parses but cannot work in front of a real Moodle site:
//! settings that would log students out or take the site down the moment students
//! arrive. `check` refuses such a file, each refusal naming its key, what Moodle would
//! do, and the way out; `run` logs the same lines as errors and starts anyway (a site
//! with no SCORM activity may live with node-local sessions).
//!
//! Beside them, [`warnings`](Config::warnings): settings that work, but cost
//! students their login on a day that will come (a crash), which `check` and `run`
//! say plainly without refusing the file.
//!
//! Kept apart from [`Config::parse`](super::Config::parse), which checks that each
//! value is well-formed: these rules judge values together, against Moodle's own
//! behaviour (the book's "Moodle behind a proxy", docs/src/moodle.md, as seen on a real
//! Moodle 4.5 by the real-Moodle suite), and tests that run stand-in nodes
//! (which are not Moodle) build configs these rules would refuse.

use std::path::Path;

use super::{error, Config, ConfigError, ConfigErrors, SessionStore, StoreConfig};
use crate::moodle::{RequestKind, Site};

impl Config {
    /// What `check` accepts: [`Config::load`], and then no
    /// [`refusals`](Config::refusals), reported like any other problem of the file.
    pub fn load_for_site(path: &Path) -> Result<Config, ConfigErrors> {
        let config = Config::load(path)?;
        match config.refusals() {
            refusals if refusals.is_empty() => Ok(config),
            refusals => Err(ConfigErrors::new(refusals).with_source(path.display().to_string())),
        }
    }

    /// Every reason this config cannot work on a real Moodle site; empty when it can.
    pub fn refusals(&self) -> Vec<ConfigError> {
        [
            self.scorm_needs_the_session(),
            self.wwwroot_port_is_not_ours(),
            self.probe_starts_sessions(),
            self.forgets_sessions_moodle_keeps(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// SCORM files go to the data server, which serves them only after
    /// `require_login()`: with node-local sessions it holds no student's session, so
    /// Moodle 4.5 answers every SCORM file with a 303 to the login page and a new
    /// session cookie, and the student is logged out (140 of 140 students, seen).
    fn scorm_needs_the_session(&self) -> Option<ConfigError> {
        let scorm_on_data = self.offload.is_none();
        (self.session.store == SessionStore::NodeLocal && scorm_on_data).then(|| {
            error(
                "session.store",
                None,
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
            error(
                "session.logged_in_idle",
                None,
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
        Some(error(
            "site.wwwroot",
            None,
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
            _ => Some(error(
                "health.path",
                None,
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

    /// What works today but logs students out on a bad day; empty when nothing does.
    pub fn warnings(&self) -> Vec<ConfigError> {
        [self.crash_forgets_logins()]
            .into_iter()
            .flatten()
            .collect()
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
            error(
                "route_cookie",
                None,
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
}

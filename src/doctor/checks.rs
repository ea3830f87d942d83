//! The questions, in the order an expert asks them: can each node be reached and
//! does the probe pass; does each answer for the gateway's wwwroot with the
//! gateway's scheme; is it the same Moodle everywhere; are sessions where the gateway
//! believes they are; does the offload work end to end; do the clocks agree.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use http::HeaderValue;

use super::ask::{Answer, Asker, Visitor};
use super::{Finding, Login, Options, Report, Seen};
use crate::config::{Config, SessionStore, UpstreamConfig, Wwwroot};
use crate::moodle::{self, PageSettings, Revisions, Site};

/// A clock this far from the gateway's is a finding: quiz timers, session timeouts and
/// `If-Modified-Since` all compare server times.
const CLOCK_SLACK_SECS: i64 = 5;
/// Each request's whole time.
const TIMEOUT: Duration = Duration::from_secs(15);
/// Redirects followed after a login, all on the same node.
const MAX_HOPS: usize = 6;

/// One node as the first look left it.
struct Visit<'c> {
    upstream: &'c UpstreamConfig,
    /// The data server (`[data]`), not a PHP node.
    data: bool,
    /// The not-logged-in session the login page gave, reused for everything else.
    visitor: Visitor,
    settings: Option<PageSettings>,
    token: Option<String>,
    /// The page's `/lib/javascript.php/…` link, under wwwroot.
    script: Option<String>,
    /// The login page was a redirect away (a wrong wwwroot, a missing sslproxy).
    redirected: bool,
}

struct Exam<'c> {
    config: &'c Config,
    wwwroot: &'c Wwwroot,
    /// wwwroot without a trailing slash, as Moodle writes it.
    root: String,
    asker: Asker,
    report: Report,
}

pub(super) async fn examine(config: &Config, options: &Options) -> Report {
    let Some(wwwroot) = config.site.wwwroot.as_ref() else {
        return Report {
            cannot_ask: Some(
                "the config has no [site] wwwroot: the doctor asks each node as wwwroot's \
                 students reach it (add wwwroot = \"https://…\", copied from config.php)"
                    .into(),
            ),
            ..Report::default()
        };
    };
    let Ok(public_host) = HeaderValue::from_str(&wwwroot.host) else {
        return Report {
            cannot_ask: Some(format!(
                "wwwroot's host {:?} is not a Host header",
                wwwroot.host
            )),
            ..Report::default()
        };
    };
    let https = wwwroot.https || config.tls.is_some();
    let mut exam = Exam {
        config,
        wwwroot,
        root: wwwroot.url.trim_end_matches('/').to_owned(),
        asker: Asker {
            public_host,
            forwarded_proto: if https { "https" } else { "http" },
            timeout: TIMEOUT,
            site: Site::new(
                &wwwroot.path,
                &config.session.cookie,
                &config.session.cookie_path,
            ),
            cookie: config.session.cookie.clone(),
        },
        report: Report {
            wwwroot: wwwroot.url.clone(),
            ..Report::default()
        },
    };
    let mut visits = Vec::new();
    let upstreams = config.nodes.iter().map(|n| (n, false));
    for (upstream, data) in upstreams.chain([(&config.data, true)]) {
        if let Some(visit) = exam.first_look(upstream, data).await {
            visits.push(visit);
        }
    }
    if visits.is_empty() {
        return exam.report;
    }
    for node in &config.nodes {
        let redirected = (visits.iter()).any(|v| v.upstream.name == node.name && v.redirected);
        exam.low_pool(node, redirected).await;
    }
    exam.same_moodle(&visits);
    exam.sessions(&mut visits).await;
    exam.javascript(&mut visits).await;
    if let Some(offload) = &config.offload {
        exam.export(offload).await;
    }
    match &options.login {
        Some(login) => {
            exam.logins(&mut visits, login, options.file.as_deref())
                .await
        }
        None => exam.report.unchecked.push(
            "logging in, and files accelerated through the offload: give --login USER \
             (a test account; the password comes from MOODLE_GATEWAY_DOCTOR_PASSWORD or a prompt)"
                .into(),
        ),
    }
    exam.report
}

impl<'c> Exam<'c> {
    fn path(&self, script: &str) -> String {
        format!("{}{script}", self.wwwroot.path.trim_end_matches('/'))
    }

    fn find(&mut self, node: &str, setting: &str, saw: String, why: &str, fix: String) {
        self.report.findings.push(Finding {
            node: node.to_owned(),
            setting: setting.to_owned(),
            saw,
            why: why.to_owned(),
            fix,
        });
    }

    fn seen(&mut self, name: &str) -> &mut Seen {
        let at = self.report.nodes.iter().position(|s| s.node == name);
        let at = at.unwrap_or_else(|| {
            self.report.nodes.push(Seen {
                node: name.to_owned(),
                ..Seen::default()
            });
            self.report.nodes.len() - 1
        });
        &mut self.report.nodes[at]
    }

    /// The health probe, then the login page as a student's first request.
    async fn first_look(&mut self, upstream: &'c UpstreamConfig, data: bool) -> Option<Visit<'c>> {
        let name = upstream.name.as_str();
        let address = upstream.authority.as_str().to_owned();
        self.seen(name).address = address.clone();
        let health = &self.config.health;
        let host = health.host.clone().unwrap_or_else(|| address.clone());
        let mut probe = None;
        match self.asker.get_as(&address, &health.path, &host).await {
            Err(error) => {
                self.seen(name).health = error.clone();
                self.find(
                    name,
                    "reachability",
                    format!("GET {} on {address}: {error}", health.path),
                    "the gateway cannot reach it either: students dealt to it wait, then go elsewhere \
                     (node-local sessions: logged out)",
                    format!(
                        "start its web server, or correct the url of [[{}]] {name} in the gateway's config",
                        if data { "data" } else { "nodes" }
                    ),
                );
                return None;
            }
            Ok(answer) => {
                self.seen(name).reached = true;
                self.seen(name).health = answer.summary();
                if moodle::in_maintenance(answer.status.as_u16(), &answer.headers) {
                    // Said once, on the login page below.
                } else if !health.accepts(answer.status.as_u16()) {
                    let fix = match answer.location() {
                        Some(_) => format!(
                            "[health] host = \"{}\" (Moodle redirects a request whose Host is not \
                             wwwroot's), or [health] path = a page that answers 200 without login",
                            self.asker.public_host.to_str().unwrap_or_default()
                        ),
                        None => "[health] path = a page that answers 200 without login \
                                 (\"/login/index.php\"), or [health] statuses to include this answer"
                            .to_owned(),
                    };
                    probe = Some(Finding {
                        node: name.to_owned(),
                        setting: "[health]".into(),
                        saw: format!("GET {} with Host {host}: {}", health.path, answer.summary()),
                        why:
                            "the gateway counts the node as down although it works: no student is \
                              dealt to it, and its students are moved away"
                                .into(),
                        fix,
                    });
                }
            }
        }
        let visit = self.login_page(upstream, data).await;
        // A node that redirects its login page away redirects the probe the same way:
        // one fix (its wwwroot or sslproxy), said once.
        let redirected = visit.as_ref().is_some_and(|v| v.redirected);
        if let Some(probe) = probe.filter(|_| !redirected) {
            self.report.findings.push(probe);
        }
        visit
    }

    /// The login page, as a student's first request gets it.
    async fn login_page(&mut self, upstream: &'c UpstreamConfig, data: bool) -> Option<Visit<'c>> {
        let name = upstream.name.as_str();
        let address = upstream.authority.as_str().to_owned();
        let mut visit = Visit {
            upstream,
            data,
            visitor: Visitor::default(),
            settings: None,
            token: None,
            script: None,
            redirected: false,
        };
        let login = self.path("/login/index.php");
        let answer = match self.asker.get(&address, &login, &mut visit.visitor).await {
            Ok(answer) => answer,
            Err(error) => {
                self.seen(name).login_page = error.clone();
                self.find(
                    name,
                    "reachability",
                    format!("GET {login}: {error}"),
                    "the node answers the probe but not a student's page",
                    "look at the node's web server and PHP error logs".into(),
                );
                return None;
            }
        };
        self.seen(name).login_page = answer.summary();
        self.clock(name, &answer);
        let html = answer.text();
        if moodle::in_maintenance(answer.status.as_u16(), &answer.headers) {
            self.find(
                name,
                "maintenance mode",
                format!("GET {login}: {} (Moodle's maintenance page)", answer.status),
                "students get the maintenance page instead of the site",
                "php admin/cli/maintenance.php --disable (or Site administration > Server > \
                 Maintenance mode); a climaintenance.html left in $CFG->dataroot does the same"
                    .into(),
            );
            return Some(visit);
        }
        if let Some(location) = answer.location() {
            self.redirected(name, &login, &answer, location);
            visit.redirected = true;
            return Some(visit);
        }
        if moodle::reverse_proxy_abused(&html) {
            self.find(
                name,
                "$CFG->reverseproxy",
                format!(
                    "GET {login}: {} with Moodle's reverseproxyabused error",
                    answer.status
                ),
                "every page is an error: the setting is for a proxy that rewrites Host, and the \
                 gateway keeps the browser's",
                format!("in {name}'s config.php, remove $CFG->reverseproxy = true;"),
            );
            return Some(visit);
        }
        match moodle::page_settings(&html) {
            None => self.find(
                name,
                "Moodle",
                format!(
                    "GET {login}: {} without Moodle's page settings (M.cfg)",
                    answer.status
                ),
                "what students get from this node is not Moodle's login page",
                "look at the node's web server and PHP error logs".into(),
            ),
            Some(settings) => {
                if settings.wwwroot.trim_end_matches('/') != self.root {
                    self.find(
                        name,
                        "$CFG->wwwroot",
                        format!("the login page's M.cfg.wwwroot is {}", settings.wwwroot),
                        "the node writes links and redirects to another address than the gateway's: \
                         students leave the site, and cookies do not follow",
                        format!("in {name}'s config.php: $CFG->wwwroot = '{}';", self.root),
                    );
                }
                let seen = self.seen(name);
                seen.wwwroot = settings.wwwroot.clone();
                seen.revisions = Some(settings.revisions.clone());
                visit.token = moodle::login_token(&html).map(str::to_owned);
                visit.script = moodle::linked(&html, &self.root, "/lib/javascript.php/");
                visit.settings = Some(settings);
            }
        }
        Some(visit)
    }

    /// A node's low-priority pool (`low_priority_url`), asked for the login page as
    /// a newcomer's request is sent there. Its web server must give PHP wwwroot's
    /// port, as the node's own does: Moodle redirects every request whose port is
    /// not wwwroot's, and the redirect leads back through the gateway to the same
    /// pool, so every login, page view and quiz start loops. A pool that cannot be
    /// reached serves nothing: the gateway sends its requests to `url`.
    async fn low_pool(&mut self, upstream: &UpstreamConfig, own_redirected: bool) {
        let Some(low) = &upstream.low_priority else {
            return;
        };
        let (name, address) = (upstream.name.as_str(), low.as_str());
        let login = self.path("/login/index.php");
        let key = format!("[[nodes]] {name} low_priority_url");
        let answer = (self.asker)
            .get(address, &login, &mut Visitor::default())
            .await;
        let saw = match &answer {
            Ok(answer) => answer.summary(),
            Err(error) => error.clone(),
        };
        self.seen(name).low_priority = format!("{address}: {saw}");
        let saw = format!(
            "GET {login} on {address} with Host {}: {saw}",
            self.asker.public_host.to_str().unwrap_or("")
        );
        let answer = match answer {
            Ok(answer) => answer,
            Err(_) => {
                return self.find(
                    name,
                    "low_priority_url",
                    saw,
                    "the pool does not answer: a request the gateway cannot send there goes \
                     to the node's url (logged once a minute), without priority; one it sends \
                     and that is never answered waits for it",
                    format!(
                        "start the node's second PHP pool and its web server at {address}, or \
                         remove {key}"
                    ),
                );
            }
        };
        if answer.location().is_some() {
            // The node's own login page redirects too: one cause (its wwwroot or
            // sslproxy), said once, on the node.
            if own_redirected {
                return;
            }
            let https = self.wwwroot.https;
            let port = self.wwwroot.port.unwrap_or(if https { 443 } else { 80 });
            return self.find(
                name,
                "low_priority_url",
                saw,
                "Moodle redirects a request whose port is not wwwroot's, and this pool's \
                 PHP is given its own: every login, page view and quiz start sent to it \
                 is a redirect back to the same pool, a loop",
                format!(
                    "in the web server in front of the pool at {address}, give PHP \
                     wwwroot's port (nginx: fastcgi_param SERVER_PORT {port};), as the \
                     node's own server block does"
                ),
            );
        }
        let moodle = answer.status.is_success() && moodle::page_settings(&answer.text()).is_some();
        if !moodle && !moodle::in_maintenance(answer.status.as_u16(), &answer.headers) {
            self.find(
                name,
                "low_priority_url",
                saw,
                "what students sent to this pool get (logins, page views, quiz starts) is \
                 not Moodle's login page: the gateway passes it on as it is",
                "look at the pool's web server and PHP error logs (a PHP-FPM pool that is \
                 down answers 502 through its web server)"
                    .into(),
            );
        }
    }

    /// A login page answered with a redirect: to another wwwroot, or to the https one
    /// (the node sees plain http and has no `sslproxy`).
    fn redirected(&mut self, name: &str, asked: &str, answer: &Answer, location: &str) {
        let saw = format!(
            "GET {asked} with Host {}: {}",
            self.asker.public_host.to_str().unwrap_or(""),
            answer.summary()
        );
        let ours = location == self.root || location.starts_with(&format!("{}/", self.root));
        if ours && self.wwwroot.https {
            self.find(
                name,
                "$CFG->sslproxy",
                saw,
                "the node sees plain http from the gateway and sends students to https again: \
                 every page is a redirect loop",
                format!("in {name}'s config.php: $CFG->sslproxy = true;"),
            );
        } else if ours {
            self.find(
                name,
                "$CFG->wwwroot",
                saw,
                "the node redirects its own login page to itself: students loop",
                format!(
                    "in {name}'s config.php: $CFG->wwwroot = '{}'; and, if it is behind a web server \
                     on another port, pass the public port to PHP (Moodle compares it)",
                    self.root
                ),
            );
        } else {
            let origin = origin(location);
            self.find(
                name,
                "$CFG->wwwroot",
                format!("{saw} (this node's wwwroot is {origin})"),
                "Moodle sends every request whose Host is not its own wwwroot's to that address: \
                 students dealt to this node are sent away from the gateway",
                format!("in {name}'s config.php: $CFG->wwwroot = '{}';", self.root),
            );
        }
    }

    fn clock(&mut self, name: &str, answer: &Answer) {
        let Some(date) = answer.date() else { return };
        let now = SystemTime::now();
        let offset = match date.duration_since(now) {
            Ok(ahead) => ahead.as_secs() as i64,
            Err(behind) => -(behind.duration().as_secs() as i64),
        };
        self.seen(name).clock_offset_secs = Some(offset);
        if offset.abs() > CLOCK_SLACK_SECS {
            self.find(
                name,
                "clock",
                format!(
                    "Date: {} ({offset:+} s from the gateway's clock)",
                    answer.header("date")
                ),
                "quiz time limits, session timeouts and cached files compare server clocks: a \
                 student moved between nodes sees time jump",
                format!("synchronise {name}'s clock (chrony or systemd-timesyncd) with the others"),
            );
        }
    }

    /// The same Moodle everywhere: the revisions every page links to.
    fn same_moodle(&mut self, visits: &[Visit<'_>]) {
        let nodes: Vec<(&str, &Revisions)> = visits
            .iter()
            .filter(|v| !v.data)
            .filter_map(|v| Some((v.upstream.name.as_str(), &v.settings.as_ref()?.revisions)))
            .collect();
        let mut counts: BTreeMap<&Revisions, usize> = BTreeMap::new();
        for (_, revisions) in &nodes {
            *counts.entry(revisions).or_default() += 1;
        }
        let Some(usual) = majority(nodes.iter().map(|(_, r)| *r), &counts) else {
            return;
        };
        for (name, revisions) in nodes {
            if revisions != usual {
                self.find(
                    name,
                    "theme and JavaScript revisions",
                    format!(
                        "themerev {} jsrev {} templaterev {}; the other nodes: {} {} {}",
                        revisions.themerev,
                        revisions.jsrev,
                        revisions.templaterev,
                        usual.themerev,
                        usual.jsrev,
                        usual.templaterev
                    ),
                    "this node links other theme and JavaScript URLs than the rest: a student \
                     moving between nodes loads everything again, and a node can be asked for a \
                     revision it never built",
                    format!(
                        "run the same Moodle code on every node, then purge caches once (php \
                         admin/cli/purge_caches.php) with MUC's application caches in a store every \
                         node shares; remove any $CFG->themerev, $CFG->jsrev or $CFG->templaterev \
                         from {name}'s config.php"
                    ),
                );
            }
        }
    }

    /// Presents the first node's session to every other: a node that reads the same
    /// store shows the same login token.
    async fn sessions(&mut self, visits: &mut [Visit<'c>]) {
        let reference = visits
            .iter()
            .find(|v| !v.data && v.token.is_some() && v.visitor.session.is_some());
        let Some(reference) = reference else {
            self.report
                .unchecked
                .push("the session store: no node showed a login page with a session".into());
            return;
        };
        let (first, token, session) = (
            reference.upstream.name.clone(),
            reference.token.clone(),
            reference.visitor.clone(),
        );
        self.seen(&first).sessions = "its own (the reference)".into();
        let store = self.config.session.store;
        let offload = self.config.offload.is_some();
        let login = self.path("/login/index.php");
        let mut own = Vec::new();
        for visit in visits
            .iter()
            .filter(|v| v.upstream.name != first && v.token.is_some())
        {
            // Node-local with the offload: the data server only exports files.
            if visit.data && offload {
                continue;
            }
            let name = visit.upstream.name.as_str();
            let mut guest = session.clone();
            let address = visit.upstream.authority.as_str();
            let Ok(answer) = self.asker.get(address, &login, &mut guest).await else {
                continue;
            };
            let shown = moodle::login_token(&answer.text()).map(str::to_owned);
            let shared = shown.is_some() && shown == token;
            self.seen(name).sessions = if shared {
                format!("shared with {first}")
            } else {
                "its own".into()
            };
            if !shared {
                own.push((name.to_owned(), visit.data));
            }
        }
        let saw = |name: &str| {
            format!(
                "{first}'s session cookie shown to {name}: another login token on the login page, \
                 so {name} does not read {first}'s sessions"
            )
        };
        match store {
            SessionStore::Shared => {
                for (name, data) in own {
                    let why = if data {
                        "SCORM files are served by the data server, which cannot read the students' \
                         sessions: every SCORM file logs the student out"
                    } else {
                        "the gateway moves students freely between nodes because it was told sessions \
                         are shared: a student moved to this node is logged out"
                    };
                    self.find(
                        &name,
                        "[session] store",
                        saw(&name),
                        why,
                        format!(
                            "give {name}'s config.php the same session store as {first} \
                             ($CFG->session_handler_class and its settings), or, if each node keeps \
                             its own sessions on purpose, [session] store = \"node-local\" with [offload]"
                        ),
                    );
                }
            }
            SessionStore::NodeLocal => {
                let others = visits
                    .iter()
                    .filter(|v| !v.data && v.token.is_some())
                    .count();
                if own.is_empty() && others > 1 {
                    self.find(
                        "site",
                        "[session] store",
                        format!("every node read {first}'s session: the sessions are shared"),
                        "the gateway holds a student for a down node (failover_hold) instead of \
                         moving them at once, for nothing",
                        "[session] store = \"shared\" in the gateway's config".into(),
                    );
                } else if !offload {
                    self.find(
                        "site",
                        "[offload]",
                        "node-local sessions and no [offload]".into(),
                        "SCORM files go to the data server, which cannot read a node's session: every \
                         SCORM file logs the student out",
                        "[offload] in the gateway's config, with $CFG->xsendfile = 'X-Accel-Redirect'; \
                         on every node"
                            .into(),
                    );
                }
            }
        }
    }

    /// The data server's file export answers for the prefix, as the gateway probes it.
    async fn export(&mut self, offload: &crate::config::OffloadConfig) {
        let address = offload.authority.as_str();
        let path = offload
            .probe
            .clone()
            .unwrap_or_else(|| offload.prefix.clone());
        let answer = self.asker.get_as(address, &path, address).await;
        let seen = self.seen("export");
        seen.address = address.to_owned();
        let up = match &answer {
            Ok(a) if offload.probe.is_some() => a.status.is_success(),
            Ok(a) => a.status.as_u16() < 500,
            Err(_) => false,
        };
        seen.reached = answer.is_ok();
        seen.health = match &answer {
            Ok(a) => a.summary(),
            Err(e) => e.clone(),
        };
        if !up {
            let saw = format!("GET {path} on {address}: {}", seen.health);
            self.find(
                "export",
                "[offload] url",
                saw,
                "every file a node authorises is fetched from here: students get a 502 for each \
                 SCORM file",
                format!(
                    "start the data server's file export (nginx: `location {} {{ alias \
                     /path/to/moodledata/; }}`), or correct [offload] url and probe",
                    offload.prefix
                ),
            );
        }
    }

    /// The JavaScript each node's login page links, fetched from that node: the same
    /// Moodle code gives the same bytes. (The release itself is shown to no visitor.)
    /// With `[offload]`, an accelerated answer means `$CFG->localcachedir` lies inside
    /// the exported dataroot: Moodle then hands its own caches to the export too.
    async fn javascript(&mut self, visits: &mut [Visit<'c>]) {
        let prefix = self.config.offload.as_ref().map(|o| o.prefix.clone());
        let mut seen: Vec<(String, String, u64, usize)> = Vec::new();
        for visit in visits.iter_mut().filter(|v| !v.data) {
            let Some(script) = visit.script.clone() else {
                continue;
            };
            let name = visit.upstream.name.clone();
            let address = visit.upstream.authority.as_str();
            let path = self.path(&script);
            let Ok(answer) = self.asker.get(address, &path, &mut visit.visitor).await else {
                continue;
            };
            let accel = answer.header("x-accel-redirect").to_owned();
            if prefix
                .as_deref()
                .is_some_and(|p| !accel.is_empty() && accel.starts_with(p))
            {
                self.find(
                    &name,
                    "$CFG->localcachedir",
                    format!("GET {path}: X-Accel-Redirect: {accel}"),
                    "the node's own theme and JavaScript cache lives in the shared dataroot: every \
                     node builds and reads it over the shared disk, and a purge on one node races \
                     the others",
                    format!(
                        "in {name}'s config.php: $CFG->localcachedir = '/var/cache/moodle'; (a local \
                         directory of each node, outside $CFG->dataroot)"
                    ),
                );
            }
            if answer.status.is_success() && accel.is_empty() {
                let mut hasher = siphasher::sip::SipHasher13::new();
                std::hash::Hasher::write(&mut hasher, &answer.body);
                let hash = std::hash::Hasher::finish(&hasher);
                seen.push((name, script, hash, answer.body.len()));
            }
        }
        let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
        for (_, _, hash, _) in &seen {
            *counts.entry(*hash).or_default() += 1;
        }
        let Some(usual) = majority(seen.iter().map(|s| s.2), &counts) else {
            return;
        };
        let Some(&(_, _, _, usual_len)) = seen.iter().find(|s| s.2 == usual) else {
            return;
        };
        for (name, script, hash, len) in &seen {
            if *hash != usual {
                self.find(
                    name,
                    "Moodle code",
                    format!(
                        "GET {script}: {len} bytes of JavaScript; the other nodes send other bytes \
                         ({usual_len}) for the same URL"
                    ),
                    "the nodes run different Moodle code: pages, fixes and database expectations \
                     differ with the node a student is dealt to",
                    format!(
                        "deploy the same Moodle release to {name} as to the others (compare \
                         version.php's $release), then purge caches once"
                    ),
                );
            }
        }
    }

    /// Logs the test account in on each node, proves a file comes back accelerated
    /// and the export serves it (with `[offload]`), and logs out again.
    async fn logins(&mut self, visits: &mut [Visit<'c>], login: &Login, file: Option<&str>) {
        let mut file = file.map(str::to_owned);
        let offload = self.config.offload.clone();
        for visit in visits.iter_mut().filter(|v| !v.data && v.token.is_some()) {
            let name = visit.upstream.name.clone();
            let address = visit.upstream.authority.as_str().to_owned();
            let Some(settings) = self.log_in(&name, &address, visit, login).await else {
                continue;
            };
            if let Some(offload) = &offload {
                if file.is_none() {
                    file = self.find_file(&address, &mut visit.visitor).await;
                }
                match &file {
                    Some(file) => {
                        self.accelerated(&name, &address, visit, file, offload)
                            .await
                    }
                    None => self.report.unchecked.push(format!(
                        "files accelerated on {name}: the test account sees no file resource; give \
                         --file /pluginfile.php/… (a file it may read)"
                    )),
                }
            }
            self.log_out(&name, &address, visit, &settings).await;
        }
    }

    async fn log_in(
        &mut self,
        name: &str,
        address: &str,
        visit: &mut Visit<'_>,
        login: &Login,
    ) -> Option<PageSettings> {
        let path = self.path("/login/index.php");
        let form = form(&[
            ("anchor", ""),
            ("logintoken", visit.token.as_deref().unwrap_or("")),
            ("username", &login.username),
            ("password", &login.password),
        ]);
        let before = visit.visitor.session.clone();
        let mut answer = match self
            .asker
            .post_form(address, &path, form, &mut visit.visitor)
            .await
        {
            Ok(answer) => answer,
            Err(error) => {
                self.find(
                    name,
                    "login",
                    format!("POST {path}: {error}"),
                    "students cannot log in here",
                    "look at the node's PHP error log".into(),
                );
                return None;
            }
        };
        // Moodle answers 303 to `?testsession=ID`, then 303 to the page the student
        // wanted: followed on the same node, as the gateway keeps the new id there.
        for _ in 0..MAX_HOPS {
            let Some(next) = answer.location().and_then(|l| l.strip_prefix(&self.root)) else {
                break;
            };
            let next = self.path(next);
            answer = self
                .asker
                .get(address, &next, &mut visit.visitor)
                .await
                .ok()?;
        }
        let settings = moodle::page_settings(&answer.text());
        let logged_in = settings.as_ref().is_some_and(|s| s.user_id != 0);
        if !logged_in {
            self.find(
                name,
                "login",
                format!(
                    "POST {path} as {}: ended on {} (not logged in{})",
                    login.username,
                    answer.summary(),
                    if visit.visitor.session == before { ", no new session id" } else { "" }
                ),
                "the test account could not log in through this node: check the account and \
                 password first; if they work on other nodes, this node loses its sessions \
                 between requests",
                format!(
                    "try the account in a browser; on {name}, check $CFG->session_handler_class and \
                     that its session directory is writable"
                ),
            );
            return None;
        }
        settings
    }

    /// A `mod_resource` file the account may read: its profile's courses, a course's
    /// first file resource, and the file that resource redirects to.
    async fn find_file(&mut self, address: &str, visitor: &mut Visitor) -> Option<String> {
        let profile = self
            .asker
            .get(address, &self.path("/user/profile.php"), visitor)
            .await
            .ok()?;
        let courses = moodle::course_ids(&profile.text());
        for course in courses.into_iter().take(5) {
            let page = self
                .asker
                .get(
                    address,
                    &self.path(&format!("/course/view.php?id={course}")),
                    visitor,
                )
                .await
                .ok()?;
            let Some(cmid) = moodle::resource_ids(&page.text()).into_iter().next() else {
                continue;
            };
            let view = self.path(&format!("/mod/resource/view.php?id={cmid}&redirect=1"));
            let answer = self.asker.get(address, &view, visitor).await.ok()?;
            if let Some(location) = answer.location() {
                if let Some(path) = location.strip_prefix(&self.root) {
                    return Some(path.to_owned());
                }
            }
        }
        None
    }

    async fn accelerated(
        &mut self,
        name: &str,
        address: &str,
        visit: &mut Visit<'_>,
        file: &str,
        offload: &crate::config::OffloadConfig,
    ) {
        let path = self.path(file);
        let Ok(answer) = self.asker.get(address, &path, &mut visit.visitor).await else {
            return;
        };
        let accel = answer.header("x-accel-redirect").to_owned();
        if accel.is_empty() {
            let why = "the gateway expects the node to hand every file over to the data server's \
                       export; a node that sends the bytes itself keeps a PHP worker busy for the \
                       whole download, and SCORM files it cannot serve come back as errors";
            self.find(
                name,
                "$CFG->xsendfile",
                format!("GET {file} as the test account: {} without X-Accel-Redirect", answer.summary()),
                why,
                format!(
                    "in {name}'s config.php: $CFG->xsendfile = 'X-Accel-Redirect'; \
                     $CFG->xsendfilealiases = ['{}' => $CFG->dataroot]; and a $CFG->localrequestdir \
                     that exists on the node (Moodle accelerates nothing when it is missing)",
                    offload.prefix
                ),
            );
            return;
        }
        if !accel.starts_with(&offload.prefix) {
            self.find(
                name,
                "$CFG->xsendfilealiases",
                format!(
                    "GET {file}: X-Accel-Redirect: {accel}, not under {}",
                    offload.prefix
                ),
                "the gateway fetches only names under its [offload] prefix: this file is a 502",
                format!(
                    "in {name}'s config.php: $CFG->xsendfilealiases = ['{}' => $CFG->dataroot];",
                    offload.prefix
                ),
            );
            return;
        }
        let export = offload.authority.as_str();
        match self.asker.get_as(export, &accel, export).await {
            Ok(bytes) if bytes.status.is_success() => {}
            seen => {
                let seen = match seen {
                    Ok(a) => a.summary(),
                    Err(e) => e,
                };
                self.find(
                    "export",
                    "[offload] url",
                    format!("GET {accel} (named by {name}) on {export}: {seen}"),
                    "the node authorised the file but the export does not serve it: students get \
                     a 502",
                    format!(
                        "the export must serve $CFG->dataroot under {}: nginx `location {} {{ alias \
                         /path/to/moodledata/; }}`",
                        offload.prefix, offload.prefix
                    ),
                );
            }
        }
    }

    async fn log_out(
        &mut self,
        name: &str,
        address: &str,
        visit: &mut Visit<'_>,
        settings: &PageSettings,
    ) {
        let before = visit.visitor.session.clone();
        let path = self.path(&format!("/login/logout.php?sesskey={}", settings.sesskey));
        let answer = self.asker.get(address, &path, &mut visit.visitor).await;
        let rotated = visit.visitor.session.is_some() && visit.visitor.session != before;
        if !rotated {
            let seen = match answer {
                Ok(a) => a.summary(),
                Err(e) => e,
            };
            self.find(
                name,
                "logout",
                format!("GET /login/logout.php?sesskey=…: {seen}, no new session id"),
                "the test account's session may still be open on this node",
                "end it under Site administration > Users > Browse list of users > the account > \
                 Log out of all sessions"
                    .into(),
            );
        }
    }
}

/// The most common of `values` (counted in `counts`); on a tie, the first one's.
fn majority<T: Ord + Copy>(
    mut values: impl Iterator<Item = T>,
    counts: &BTreeMap<T, usize>,
) -> Option<T> {
    let first = values.next()?;
    let most = counts.values().copied().max()?;
    if counts.get(&first) == Some(&most) {
        return Some(first);
    }
    counts.iter().find(|(_, n)| **n == most).map(|(v, _)| *v)
}

/// `https://host:port/path` → `https://host:port`.
fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(slash) => &url[..after_scheme + slash],
        None => url,
    }
}

fn form(fields: &[(&str, &str)]) -> String {
    let encode = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_is_scheme_and_authority() {
        assert_eq!(
            origin("http://other:9000/login/index.php"),
            "http://other:9000"
        );
        assert_eq!(
            origin("https://moodle.example.edu"),
            "https://moodle.example.edu"
        );
    }

    #[test]
    fn a_form_is_percent_encoded() {
        assert_eq!(
            form(&[("username", "a b"), ("password", "p&=")]),
            "username=a%20b&password=p%26%3D"
        );
    }
}

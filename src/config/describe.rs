//! [`Config::describe`]: the resolved setup in plain words, for
//! `moodle-gateway check`. It says what each setting will *do*, so an admin can
//! read the effect of a change before restarting; secrets are named by where they
//! came from, never shown; limits are shown with the status they answer.

use std::time::Duration;

use super::values::format_size;
use super::{
    AccessLogFormat, AccessLogTo, Config, NodeState, QuizStarts, SessionStore, StatusRange,
    StoreConfig,
};

fn d(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

impl Config {
    /// The resolved setup in plain words, one setting per line. Names where the
    /// admin token and the route secret came from, never their values.
    pub fn describe(&self) -> String {
        let (s, t) = (&self.session, &self.timeouts);
        let admin = match &self.admin {
            Some(a) => format!("{} (token: set, from {})", a.listen, a.token_source),
            None => "none (no [admin] section)".to_owned(),
        };
        let proxies: Vec<String> = self.trusted_proxies.iter().map(|n| n.to_string()).collect();
        let proxies = if proxies.is_empty() {
            "none (X-Forwarded-For from clients is replaced)".to_owned()
        } else {
            format!("{} (their X-Forwarded-For is extended)", proxies.join(", "))
        };
        let site = Some(self.site.path.as_str()).filter(|p| !p.is_empty());
        let site = site.unwrap_or("/ (Moodle at the host root)");
        let (login, anon) = (d(s.logged_in_idle), d(s.anonymous_idle));
        let [conn, head, pool, req, kept, body, tunnel] = [
            t.connect,
            t.response_headers,
            t.upstream_idle,
            t.request_headers,
            t.keep_alive,
            t.body_idle,
            t.tunnel_idle,
        ]
        .map(d);
        let rate = match t.upload_min_rate {
            0 => "no rate floor".to_owned(),
            n => format!(
                "at least {}/s over {}",
                format_size(n),
                d(t.upload_rate_window)
            ),
        };
        let upload = d(t.upload);
        format!(
            "public listener: {}\ntls: {}\n{}admin listener: {admin}\ntrusted proxies: {proxies}\n\
             {}site path: {site}\nsite hosts: {}\nsession cookie: {} (path {})\nbalance: {}\n\
             slow start: {}\nsessions: at most {}; forgotten after {login} idle when logged in, {anon} when anonymous\n\
             timeouts: connect {conn}, response headers {head}, upstream idle {pool}, request headers {req}, \
             client keep-alive {kept}, body idle {body}, \
             tunnel idle {tunnel}, uploads {rate} and {upload} in all\nlimits: {}\n{}{}",
            self.listen,
            self.describe_tls(),
            self.describe_acme(),
            self.describe_wwwroot(),
            self.describe_hosts(),
            s.cookie,
            s.cookie_path,
            s.balance,
            self.describe_slow_start(),
            s.max_sessions,
            self.describe_limits(),
            self.describe_operations(),
            self.describe_routing()
        )
    }

    /// `[session] slow_start`: how a node back in the deal ramps up.
    fn describe_slow_start(&self) -> String {
        let back = "a node back from down, draining or disabled";
        match self.session.slow_start {
            w if w.is_zero() => format!("off ({back} gets its full share of new sessions at once)"),
            w => format!(
                "{back} gets a tenth of its share of new sessions, rising to all of it over {}",
                d(w)
            ),
        }
    }

    /// `[site] wwwroot`, with what every node's config.php must agree on.
    fn describe_wwwroot(&self) -> String {
        let Some(w) = &self.site.wwwroot else {
            return String::new();
        };
        let port = match w.port {
            Some(port) => format!(
                "; every node must report SERVER_PORT {port} (Apache's default \
                 UseCanonicalName Off does; nginx needs fastcgi_param SERVER_PORT {port}), or \
                 Moodle redirects"
            ),
            None => String::new(),
        };
        let tls = if w.https {
            "; TLS ends before the nodes: set $CFG->sslproxy = true"
        } else {
            ""
        };
        format!(
            "wwwroot: {} (the same $CFG->wwwroot on every node and the data server{tls}{port})\n",
            w.url
        )
    }

    /// `[site] hosts`: which `Host` headers get through.
    fn describe_hosts(&self) -> String {
        if self.site.hosts.is_empty() {
            "any (every Host header is passed on)".to_owned()
        } else {
            format!(
                "{} (requests naming another host are refused)",
                self.site.hosts.join(", ")
            )
        }
    }

    /// `[limits]`, with the status each one answers.
    fn describe_limits(&self) -> String {
        let l = &self.limits;
        let size = |n: usize| format_size(n as u64);
        format!(
            "request head {} and {} header lines (431 beyond), URI {} (414 beyond), \
             body {} (413 beyond), read whole before a node is contacted up to {}, {}; {} connections and {} requests in flight (503 beyond); \
             {} streams per HTTP/2 connection",
            size(l.max_header_bytes),
            l.max_headers,
            size(l.max_uri_bytes),
            format_size(l.max_body_bytes),
            format_size(l.buffer_body_bytes),
            self.describe_spool(),
            l.max_connections,
            l.max_in_flight,
            l.http2_max_streams
        )
    }

    /// `limits.spool_*`: how large a body waits on disk, and where.
    fn describe_spool(&self) -> String {
        let l = &self.limits;
        match l.spool_body_bytes {
            0 => "larger ones stream (no spool)".to_owned(),
            n => format!(
                "on disk up to {} ({} at once, in {})",
                format_size(n),
                format_size(l.spool_max_bytes),
                l.spool_dir.display()
            ),
        }
    }

    /// `[tls]`: the files it will read, and the redirect listener.
    fn describe_tls(&self) -> String {
        let Some(t) = &self.tls else {
            return "off (plain HTTP)".to_owned();
        };
        let redirect = t.redirect_listen.map_or_else(
            || "no redirect listener".to_owned(),
            |a| format!("plain HTTP on {a} is redirected to https"),
        );
        let hsts = t.hsts.map_or_else(
            || "no Strict-Transport-Security".to_owned(),
            |h| format!("Strict-Transport-Security: {}", h.value()),
        );
        format!(
            "on (HTTP/2 and HTTP/1.1), cert {}, key {}; {redirect}; {hsts}",
            t.cert.display(),
            t.key.display()
        )
    }

    /// `[acme]`: which CA, which names, how they are proved, where the files go
    /// and when renewal comes; empty without the section.
    fn describe_acme(&self) -> String {
        let Some(a) = &self.acme else {
            return String::new();
        };
        let proof = match a.challenge {
            super::Challenge::Http01 => {
                "http-01, answered by the redirect listener (the CA asks port 80)"
            }
            super::Challenge::TlsAlpn01 => {
                "tls-alpn-01, answered by the public listener (the CA asks port 443)"
            }
        };
        let ca = a.directory_ca.as_ref().map_or_else(
            || "its HTTPS checked against the system's roots".to_owned(),
            |p| format!("its HTTPS checked against {} only", p.display()),
        );
        let contact = a.contact.as_deref().unwrap_or("no contact email");
        format!(
            "acme: certificates for {} from {} ({ca}), proved by {proof}; account, cert.pem and \
             key.pem kept in {} (a placeholder until the first issuance); renewed {} before expiry; {contact}; {}\n",
            a.domains.join(", "),
            a.directory,
            a.dir.display(),
            d(a.renew_before),
            self.describe_acme_sharing(a.challenge)
        )
    }

    /// Whether the certificate is the site's (Redis) or this gateway's own.
    fn describe_acme_sharing(&self, challenge: super::Challenge) -> String {
        let every = d(super::ACME_LOOK_EVERY);
        match (&self.store, challenge) {
            (StoreConfig::Memory, _) => "this gateway's own certificate (no shared store)".into(),
            (StoreConfig::Redis(_), super::Challenge::Http01) => format!(
                "shared through Redis: one gateway orders at a time (a lease), every gateway \
                 answers the CA's http-01 and serves the newest certificate (looked for every {every})"
            ),
            (StoreConfig::Redis(_), super::Challenge::TlsAlpn01) => format!(
                "shared through Redis: one gateway orders at a time (a lease) and every gateway \
                 serves the newest certificate (looked for every {every}); WARNING: tls-alpn-01 \
                 is answered only by the gateway that orders, so the CA must reach that one; \
                 with several gateways use http-01, which every gateway answers"
            ),
        }
    }

    /// Failover, shutdown, health checks, snapshots and the route cookie.
    fn describe_operations(&self) -> String {
        let store = match self.session.store {
            SessionStore::Shared => {
                "shared: a student whose node is down goes to another node at once".to_owned()
            }
            SessionStore::NodeLocal => format!(
                "node-local: a student whose node is down waits up to {} for it to come back, \
                 then goes to another node and must log in again",
                d(self.session.failover_hold)
            ),
        };
        let h = &self.health;
        let statuses: Vec<String> = h.statuses.iter().map(status_range).collect();
        let snapshot = match &self.state.file {
            Some(f) if f.is_relative() => format!(
                "{} (relative to the working directory), saved every {}",
                f.display(),
                d(self.state.save_every)
            ),
            Some(f) => format!("{}, saved every {}", f.display(), d(self.state.save_every)),
            None => "off (the affinity table starts empty after a restart)".to_owned(),
        };
        let route = match &self.route_cookie {
            Some(r) => format!("{} (secret: set, from {})", r.name, r.secret_source),
            None => "none (no [route_cookie] section)".to_owned(),
        };
        format!(
            "session store: {store}\nshutdown: in-flight requests get {} to finish\n\
             health checks: GET {}{} every {}, timeout {}; an upstream is marked down after {} \
             in a row, up after {}; healthy statuses: {}\n\
             snapshot: {snapshot}\nroute cookie: {route}\ntable store: {}\naccess log: {}\n\
             session losses: a logged-in session Moodle replaces after {} idle timed out; sooner, it was lost\n\
             {}{}{}{}",
            d(self.timeouts.shutdown),
            h.path,
            h.host
                .as_ref()
                .map_or(String::new(), |host| format!(" (Host: {host})")),
            d(h.interval),
            d(h.timeout),
            count(h.fall, "failure", "failures"),
            count(h.rise, "success", "successes"),
            statuses.join(", "),
            self.describe_store(),
            self.describe_access_log(),
            d(self.session.sessiontimeout),
            self.describe_surge(),
            self.describe_cache(),
            self.describe_compression(),
            self.describe_rate_limits(),
        )
    }

    /// `[compression]`: what is compressed, and how hard.
    fn describe_compression(&self) -> String {
        let c = &self.compression;
        if !c.enabled {
            return "compression: off (answers go as the nodes send them)\n".to_owned();
        }
        let no_transform = match c.honour_no_transform {
            true => "except those marked no-transform",
            false => "even those marked no-transform",
        };
        format!(
            "compression: gzip or brotli at level {} for text, HTML, JSON, JavaScript, CSS and SVG \
answers of at least {} the node left uncompressed ({} media types), {no_transform}; never a \
range, a HEAD, an encoded body or a file offered in byte ranges\n",
            c.level,
            format_size(c.min_length),
            c.types.len(),
        )
    }

    /// `[rate_limits]`: what is limited, by what, and what never is.
    fn describe_rate_limits(&self) -> String {
        let r = &self.rate_limits;
        if !r.is_on() {
            return "rate limits: off\n".to_owned();
        }
        let rate = |rate: crate::config::Rate, per: &str| match rate.is_on() {
            true => format!(
                "{} a minute per {per} (bursts of {})",
                rate.per_minute, rate.burst
            ),
            false => format!("not per {per}"),
        };
        format!(
            "rate limits: login attempts {}, {}; page views without a logged-in session {}; \
             429 beyond; each limit remembers {} addresses or usernames; a logged-in \
             session is never limited\n",
            rate(r.login_per_address, "address"),
            rate(r.login_per_username, "username"),
            rate(r.pages_per_address, "address"),
            r.max_keys
        )
    }

    /// `[cache]`: what is kept, and how much.
    fn describe_cache(&self) -> String {
        let c = &self.cache;
        if c.enabled && c.max_bytes > 0 {
            format!(
                "asset cache: Moodle's revisioned theme and JavaScript answers that Moodle marks \
public, at most {} in all and {} each, answered from memory\n",
                format_size(c.max_bytes),
                format_size(c.max_entry_bytes)
            )
        } else {
            "asset cache: off (every theme and JavaScript request goes to a node)\n".to_owned()
        }
    }

    /// `[surge]`: the caps, the line's order and endings, the waiting room.
    fn describe_surge(&self) -> String {
        let u = &self.surge;
        let caps: Vec<usize> = self.nodes.iter().map(|n| n.cap(u)).collect();
        if caps.iter().all(|&c| c == 0) {
            return "surge: no cap (every request goes to its node at once, and PHP's own \
                    backlog queues the rest, first come first served)\n"
                .to_owned();
        }
        let per_node = if caps.iter().all(|&c| c == caps[0]) {
            format!("each node works on at most {} requests at once", caps[0])
        } else {
            "each node works on at most its max_active requests at once (see nodes)".to_owned()
        };
        let per_node = if self.nodes.iter().any(|n| n.low_priority.is_some()) {
            per_node + " (on each of its PHP pools, with a low_priority_url)"
        } else {
            per_node
        };
        let room = match &u.waiting_room {
            None => "off: newcomers wait in the line like everyone".to_owned(),
            Some(r) => format!(
                "when a newcomer's expected wait passes {}, newcomers' page views get the \
                 waiting page (503 with Retry-After, refreshing itself, {}) and a place kept \
                 for {} in cookie {}, let in first come first served",
                d(r.opens_at),
                match r.page {
                    Some(_) => "your room_page",
                    None => "the built-in page",
                },
                d(r.place_kept),
                r.cookie
            ),
        };
        let mut starts = match u.quiz_starts {
            QuizStarts::PerNode(0) => "not paced: they wait in the line like any page".to_owned(),
            QuizStarts::Auto => "at most half of each node's cap at once (at least one), the \
                                 rest waiting at the node's gate in click order"
                .to_owned(),
            QuizStarts::PerNode(n) => format!(
                "at most {n} at once per node (never more than its cap), the rest waiting at \
                 the node's gate in click order"
            ),
        };
        if u.quiz_starts != QuizStarts::PerNode(0) && matches!(self.store, StoreConfig::Redis(_)) {
            starts += ", counted for the whole site in Redis (every gateway's starts)";
        }
        if u.quiz_starts != QuizStarts::PerNode(0) {
            starts += &match u.quiz_starts_yield_at {
                0.0 => "; the site's starts do not follow the page turns".to_owned(),
                ratio => format!(
                    "; across the site a class's starts begin one at once, more while \
                     students' page turns stay near their calm time, fewer (down to one) \
                     while they take over {ratio} × it"
                ),
            };
        }
        let session = match u.session_max_active {
            0 => "no limit".to_owned(),
            n => format!("at most {n} at once at its node, the rest waiting in order"),
        };
        format!(
            "surge: {per_node}; the rest wait in the gateway, a bound session for its own \
             node: logged-in students always first (work in progress: an open quiz attempt's \
             pages, autosave and finish, a quiz start past its gate, SCORM tracking and \
             other writes; then their other pages), then anonymous sessions, then newcomers, then by arrival; within \
             students and within the crowd the second class at most {} behind later \
             arrivals; at most {} wait (503 beyond, a newcomer making way for a student); a \
             wait ends in 503 after {} (logged in), {} (a logged-in POST), {} (anonymous), {} \
             (newcomers); the Moodle app gets these answers in JSON\n\
             quiz starts (startattempt.php): {starts}, waiting at most {}; the exam timer \
             starts when Moodle creates the attempt, after the wait\n\
             one session's requests: {session}\n\
             waiting room: {room}\n",
            d(u.aging),
            u.max_waiting,
            d(u.patience),
            d(u.post_patience),
            d(u.anonymous_patience),
            d(u.newcomer_patience),
            d(u.post_patience),
        )
    }

    fn describe_store(&self) -> String {
        match &self.store {
            StoreConfig::Memory => {
                "memory (this gateway's own table, deal and node states)".to_owned()
            }
            StoreConfig::Redis(r) => format!(
                "redis at {}, as gateway {:?}, keys under {:?}; requests wait at most {} for it \
                 (secret: set, from {})",
                r.target.redacted(),
                r.name,
                r.prefix,
                d(r.timeout),
                r.secret_source
            ),
        }
    }

    fn describe_access_log(&self) -> String {
        let format = match self.access_log.format {
            AccessLogFormat::Combined => "combined log format",
            AccessLogFormat::Json => "JSON lines",
        };
        match &self.access_log.to {
            AccessLogTo::Off => "off".to_owned(),
            AccessLogTo::Stderr => format!("stderr, {format}"),
            AccessLogTo::File(path) => {
                format!("{}, {format}, reopened on SIGHUP", path.display())
            }
        }
    }

    /// The upstreams and which requests go where.
    fn describe_routing(&self) -> String {
        let (p, data) = (&self.site.path, &self.data);
        let mut out = "nodes:\n".to_owned();
        for n in &self.nodes {
            let state = match n.state {
                NodeState::Active => "",
                NodeState::Draining => " (draining: keeps its sessions, gets no new ones)",
                NodeState::Disabled => " (disabled: gets no requests)",
            };
            let cap = match n.cap(&self.surge) {
                0 => String::new(),
                cap if n.low_priority.is_some() => {
                    format!(", at most {cap} requests at once per pool")
                }
                cap => format!(", at most {cap} requests at once"),
            };
            out += &format!(
                "  {} http://{} weight {}{cap}{state}\n",
                n.name, n.authority, n.weight
            );
            if let Some(low) = &n.low_priority {
                out += &format!(
                    "    and http://{low}, its low-priority pool: everything but a logged-in \
                     student's work in progress\n"
                );
            }
        }
        let forms = format!(
            "SCORM files ({p}/pluginfile.php/*/mod_scorm/..., and the same files via \
             {p}/webservice/pluginfile.php, {p}/tokenpluginfile.php and legacy {p}/file.php)"
        );
        let (cookie, balance) = (&self.session.cookie, self.session.balance);
        let routing = match &self.offload {
            None => format!(
                "routing: {forms} go to the data server \"{}\"; every other request goes to a \
                 PHP node: the one its {cookie} cookie is bound to, otherwise the next by \
                 {balance}.\n",
                data.name
            ),
            Some(o) => format!(
                "routing: every request goes to a PHP node, {forms} too: the one its {cookie} \
                 cookie is bound to, otherwise the next by {balance} (the token forms to any \
                 node, outside the deal).\n\
                 file offload: a node that has checked the student answers X-Accel-Redirect \
                 under {}; the gateway fetches those bytes from the data server's export \
                 http://{} and streams them with the node's headers, so SCORM bytes come from \
                 the data server and the session from the student's own node; the export is \
                 probed every {} with GET {}.\n",
                o.prefix,
                o.authority,
                d(self.health.interval),
                match &o.probe {
                    Some(file) => format!("{file} (up: 2xx)"),
                    None => format!("{} (up: any answer below 500)", o.prefix),
                }
            ),
        };
        out + &format!(
            "data server: {} http://{}\n{routing}",
            data.name, data.authority
        )
    }
}

fn count(n: u32, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `200`, `2xx` for a whole class, `low-high` otherwise.
fn status_range(r: &StatusRange) -> String {
    match (r.low, r.high) {
        (low, high) if low == high => low.to_string(),
        (low, high) if low % 100 == 0 && high == low + 99 => format!("{}xx", low / 100),
        (low, high) => format!("{low}-{high}"),
    }
}

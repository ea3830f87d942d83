//! The sections that carry a secret, `[admin]` and `[route_cookie]`, and the one
//! rule both follow to find it: the environment beats the inline key, which beats
//! a file read relative to the config file. One rule, so an admin who has learnt
//! where the admin token may live knows where the route secret may live too.

use std::fs;
use std::net::SocketAddr;

use super::check::{Checker, Section, Span};
use super::values::{cookie_name, listeners_clash, route_secret_problem, token_problem};
use super::{
    io_reason, AdminConfig, RouteCookieConfig, SecretSource, TokenSource, ADMIN_TOKEN_ENV,
    DEFAULT_ADMIN_LISTEN, DEFAULT_ROUTE_COOKIE, ROUTE_SECRET_ENV,
};

const ADMIN_KEYS: &str = "listen token token_file";
const ROUTE_COOKIE_KEYS: &str = "name secret secret_file";

/// The three places one secret may be set, named as the messages name them.
pub(super) struct SecretKeys {
    pub(super) what: &'static str,
    pub(super) inline: &'static str,
    pub(super) file: &'static str,
    pub(super) env: &'static str,
}

const ADMIN_TOKEN: SecretKeys = SecretKeys {
    what: "admin token",
    inline: "token",
    file: "token_file",
    env: ADMIN_TOKEN_ENV,
};

const ROUTE_SECRET: SecretKeys = SecretKeys {
    what: "route cookie secret",
    inline: "secret",
    file: "secret_file",
    env: ROUTE_SECRET_ENV,
};

/// Which of the three places won.
pub(super) enum Found {
    Env,
    Inline,
    File,
}

/// A secret as found: the value, where, and the key (with its span) to blame
/// when the value itself is bad. An environment value has no line; it is blamed
/// on the inline key, the one it stands in for.
pub(super) struct Resolved {
    pub(super) value: String,
    pub(super) found: Found,
    pub(super) key: &'static str,
    pub(super) span: Option<Span>,
}

impl Checker<'_> {
    /// The admin listener (`None` without an `[admin]` section), returned even
    /// when the token is bad so other listeners can still be checked against
    /// it, and the whole section when it is valid.
    pub(super) fn admin(
        &mut self,
        root: &Section,
        public: SocketAddr,
    ) -> (Option<SocketAddr>, Option<AdminConfig>) {
        let s = self.open("admin".into(), root.get("admin"), ADMIN_KEYS);
        if s.table.is_none() {
            return (None, None);
        }
        let (listen, span) = match self.address(&s, "listen") {
            Some((addr, span)) => (addr, Some(span)),
            None => (DEFAULT_ADMIN_LISTEN, s.span.clone()),
        };
        if listeners_clash(listen, public) {
            let message = format!("{listen} clashes with the public listen {public}");
            self.error(s.key("listen"), span, message);
        }
        (Some(listen), self.admin_token(&s, listen))
    }

    fn admin_token(&mut self, s: &Section, listen: SocketAddr) -> Option<AdminConfig> {
        let env = self.env.admin_token.clone();
        let r = self.secret(s, env, &ADMIN_TOKEN)?;
        let token_source = match r.found {
            Found::Env => TokenSource::Env,
            Found::Inline => TokenSource::Token,
            Found::File => TokenSource::TokenFile,
        };
        if let Some(message) = token_problem(&r.value, token_source) {
            self.error(s.key(r.key), r.span, message);
            return None;
        }
        Some(AdminConfig {
            listen,
            token: r.value,
            token_source,
        })
    }

    /// Absent section, no route cookie. `session_cookie` is the name it must not take.
    pub(super) fn route_cookie(
        &mut self,
        root: &Section,
        session_cookie: &str,
    ) -> Option<RouteCookieConfig> {
        let s = self.open(
            "route_cookie".into(),
            root.get("route_cookie"),
            ROUTE_COOKIE_KEYS,
        );
        s.table?;
        let name = self.route_cookie_name(&s, session_cookie);
        let env = self.env.route_secret.clone();
        let r = self.secret(&s, env, &ROUTE_SECRET)?;
        let secret_source = match r.found {
            Found::Env => SecretSource::Env,
            Found::Inline => SecretSource::Secret,
            Found::File => SecretSource::SecretFile,
        };
        if let Some(message) = route_secret_problem(&r.value, secret_source) {
            self.error(s.key(r.key), r.span, message);
            return None;
        }
        Some(RouteCookieConfig {
            name: name?,
            secret: r.value.into_bytes(),
            secret_source,
        })
    }

    /// The gateway sets and strips its route cookie on every response; were it
    /// Moodle's session cookie, it would overwrite or delete students' sessions.
    /// Compared ignoring case: names that differ only in case are a typo, not a plan.
    fn route_cookie_name(&mut self, s: &Section, session_cookie: &str) -> Option<String> {
        let (name, span) = match self.parsed(s, "name", cookie_name) {
            Some((name, span)) => (name, Some(span)),
            None if s.get("name").is_some() => return None,
            None => (DEFAULT_ROUTE_COOKIE.to_owned(), s.span.clone()),
        };
        if !name.eq_ignore_ascii_case(session_cookie) {
            return Some(name);
        }
        let message = format!(
            "{name:?} is the session cookie ([session] cookie): \
             the route cookie must never touch Moodle's cookie"
        );
        self.error(s.key("name"), span, message);
        None
    }

    /// Precedence: `env`, then the inline key, then the file; the file is not read
    /// when something beats it. Giving both the inline key and the file is an error
    /// even then, as the file's owner cannot tell which one is live.
    pub(super) fn secret(
        &mut self,
        s: &Section,
        env: Option<String>,
        k: &SecretKeys,
    ) -> Option<Resolved> {
        let (inline, file) = (self.string(s, k.inline), self.string(s, k.file));
        if let (Some(_), Some((_, span))) = (&inline, &file) {
            let message = format!("set either {} or {}, not both", k.inline, k.file);
            self.error(s.key(k.file), Some(span.clone()), message);
        }
        let (value, found, key, span) = match (env, inline, file) {
            (Some(v), _, _) => (v, Found::Env, k.inline, None),
            (None, Some((v, span)), _) => (v.to_owned(), Found::Inline, k.inline, Some(span)),
            (None, None, Some((rel, span))) => {
                let v = self.first_line(s.key(k.file), span.clone(), rel)?;
                (v, Found::File, k.file, Some(span))
            }
            (None, None, None) => {
                let (what, inline, file, env) = (k.what, k.inline, k.file, k.env);
                let message = format!("no {what}: set {inline}, {file} or {env}");
                self.error(s.key(inline), s.span.clone(), message);
                return None;
            }
        };
        Some(Resolved {
            value,
            found,
            key,
            span,
        })
    }

    /// The trimmed first line of `rel`, relative to the config file's directory:
    /// `openssl rand -hex 32 > file` leaves a newline the secret must not include.
    fn first_line(&mut self, key: String, span: Span, rel: &str) -> Option<String> {
        let path = self.base_dir.join(rel);
        let read = fs::read_to_string(&path);
        let reason = |e| format!("cannot read {}: {}", path.display(), io_reason(&e));
        read.map(|text| text.lines().next().unwrap_or("").trim().to_owned())
            .map_err(|e| self.error(key, Some(span), reason(e)))
            .ok()
    }
}

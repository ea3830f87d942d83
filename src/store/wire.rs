//! What the gateways write in Redis and say on its channel: key names, the value of
//! a session, and the lines of a message. Pure functions, so the format is pinned by
//! tests and every gateway version that shares a Redis reads the same thing.
//!
//! ```text
//! {prefix}s:{key}     "L web1 gw-a"   a session: state (L logged in, A anonymous),
//!                                     its node, the gateway that bound it; PX = idle limit
//! {prefix}nodes       hash name → "active" | "draining" | "disabled" (admin state)
//! {prefix}deal        INCR counter: the shared deal's tickets
//! {prefix}fingerprint the live gateways' store.secret fingerprint (HMAC, 8 bytes); PX = 5 s
//! {prefix}gw:{name}   JSON heartbeat of one live gateway; PX = 5 s
//! {prefix}gateways    sorted set: gateway name → its last beat, Unix ms
//! {prefix}tls-ticket:{period}  a period's TLS ticket key, sealed; PX = a day
//! {prefix}acme:lease  the gateway ordering the ACME certificate; PX = its lease
//! {prefix}acme:certificate, acme:account   sealed JSON: the newest certificate and
//!                     key, the CA account; no expiry
//! {prefix}acme:http01:{token}   an open HTTP-01 challenge's answer; PX = 10 min
//! {prefix}events      the channel: first line the sender, then one change per line
//!                       b {key} L web1    bound (or moved)
//!                       f {key}           forgotten (logout, admin eviction)
//!                       t {key} {key} …   still in use: refresh the idle clock
//!                       n web1 draining   a node's admin state
//! ```
//!
//! Text, not a binary encoding: an operator debugging a site reads it with
//! `redis-cli`, and it costs a few bytes more per session.

use crate::config::NodeState;
use crate::sessions::affinity::{SessionKey, SessionState};

/// A change one gateway tells the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A session bound (or moved) to a node.
    Bound {
        /// The session.
        key: SessionKey,
        /// Logged in or anonymous.
        state: SessionState,
        /// The node's name.
        node: String,
    },
    /// A session gone: Moodle cleared it, or an admin evicted it.
    Forgot(SessionKey),
    /// Sessions still in use somewhere: their idle clocks restart.
    Touched(Vec<SessionKey>),
    /// An admin changed a node's state.
    NodeState {
        /// The node's name.
        node: String,
        /// Its new state.
        state: NodeState,
    },
}

/// The names of everything under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
    /// The two names a new session uses, made once: the deal and the channel.
    deal: String,
    events: String,
}

impl Keys {
    /// Keys under `prefix`.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            deal: format!("{prefix}deal"),
            events: format!("{prefix}events"),
        }
    }

    /// A session's key.
    pub fn session(&self, key: SessionKey) -> String {
        let mut name = String::with_capacity(self.prefix.len() + 18);
        name.push_str(&self.prefix);
        name.push_str("s:");
        key.push_hex(&mut name);
        name
    }

    /// The pattern of every session key, for a SCAN.
    pub fn sessions(&self) -> String {
        format!("{}s:*", self.prefix)
    }

    /// The session key a Redis key names, if it is one.
    pub fn session_of(&self, redis_key: &str) -> Option<SessionKey> {
        let hex = redis_key.strip_prefix(&self.prefix)?.strip_prefix("s:")?;
        SessionKey::from_hex(hex)
    }

    /// The hash of admin states.
    pub fn nodes(&self) -> String {
        format!("{}nodes", self.prefix)
    }

    /// The fingerprint of the live gateways' secret.
    pub fn fingerprint(&self) -> String {
        format!("{}fingerprint", self.prefix)
    }

    /// The deal counter.
    pub fn deal(&self) -> &str {
        &self.deal
    }

    /// One gateway's heartbeat.
    pub fn gateway(&self, name: &str) -> String {
        format!("{}gw:{name}", self.prefix)
    }

    /// The roll of live gateways: a sorted set of names by their last beat.
    pub fn gateway_roll(&self) -> String {
        format!("{}gateways", self.prefix)
    }

    /// The TLS ticket key of one period, sealed under `store.secret`.
    pub fn ticket_key(&self, period: u64) -> String {
        format!("{}tls-ticket:{period}", self.prefix)
    }

    /// Who orders the site's ACME certificate now (`acme.rs`): a gateway's
    /// sender id, for as long as its lease lasts.
    pub fn acme_lease(&self) -> String {
        format!("{}acme:lease", self.prefix)
    }

    /// The site's ACME certificate and key, sealed under `store.secret`.
    pub fn acme_certificate(&self) -> String {
        format!("{}acme:certificate", self.prefix)
    }

    /// The site's ACME account credentials, sealed under `store.secret`.
    pub fn acme_account(&self) -> String {
        format!("{}acme:account", self.prefix)
    }

    /// The answer to one open HTTP-01 challenge.
    pub fn acme_http01(&self, token: &str) -> String {
        format!("{}acme:http01:{token}", self.prefix)
    }

    /// A node's quiz-start leases (`starts.rs`): a sorted set of lease ids.
    pub fn starts(&self, node: &str) -> String {
        format!("{}starts:{node}", self.prefix)
    }

    /// The channel.
    pub fn events(&self) -> &str {
        &self.events
    }
}

/// A session's value: `L web1 gw-a`.
pub fn session_value(state: SessionState, node: &str, gateway: &str) -> String {
    let mut value = String::with_capacity(node.len() + gateway.len() + 3);
    value.push(state_letter(state));
    value.push(' ');
    value.push_str(node);
    value.push(' ');
    value.push_str(gateway);
    value
}

/// What a session's value says: state, node, and the gateway that bound it.
pub fn parse_session(value: &str) -> Option<(SessionState, &str, &str)> {
    let mut words = value.split(' ');
    let state = parse_state(words.next()?)?;
    let node = words.next().filter(|n| !n.is_empty())?;
    let gateway = words.next().unwrap_or("");
    Some((state, node, gateway))
}

/// One message: the sender's line, then each change on its own.
pub fn message(sender: &str, changes: &[Change]) -> String {
    let mut text = String::with_capacity(sender.len() + 32 * changes.len());
    text.push_str(sender);
    for change in changes {
        text.push('\n');
        match change {
            Change::Bound { key, state, node } => {
                text.push_str("b ");
                key.push_hex(&mut text);
                text.push(' ');
                text.push(state_letter(*state));
                text.push(' ');
                text.push_str(node);
            }
            Change::Forgot(key) => {
                text.push_str("f ");
                key.push_hex(&mut text);
            }
            Change::Touched(keys) => {
                text.push('t');
                for key in keys {
                    text.push(' ');
                    key.push_hex(&mut text);
                }
            }
            Change::NodeState { node, state } => {
                text.push_str("n ");
                text.push_str(node);
                text.push(' ');
                text.push_str(state.as_str());
            }
        }
    }
    text
}

/// Most sessions one message names: a minute's touches of a busy gateway would
/// otherwise make one message of megabytes, which Redis buffers for every
/// subscriber at once.
const MESSAGE_KEYS: usize = 1024;

/// `changes` as [`message`]s of at most [`MESSAGE_KEYS`] sessions each, in order.
pub fn messages(sender: &str, changes: &[Change]) -> Vec<String> {
    let mut out = Vec::new();
    let mut part: Vec<Change> = Vec::new();
    let mut keys = 0;
    for change in changes {
        let weight = match change {
            Change::Touched(touched) => touched.len(),
            _ => 1,
        };
        if keys + weight > MESSAGE_KEYS && !part.is_empty() {
            out.push(message(sender, &part));
            (part, keys) = (Vec::new(), 0);
        }
        part.push(change.clone());
        keys += weight;
    }
    if !part.is_empty() {
        out.push(message(sender, &part));
    }
    out
}

/// Whether `payload` is a message `sender` sent (every gateway hears its own).
pub fn sent_by(payload: &[u8], sender: &str) -> bool {
    payload
        .strip_prefix(sender.as_bytes())
        .is_some_and(|rest| rest.first() == Some(&b'\n'))
}

/// A message's sender and the changes it carries; lines this version does not know
/// are skipped, so a newer gateway can say more without confusing an older one.
pub fn parse_message(text: &str) -> (&str, Vec<Change>) {
    let mut lines = text.split('\n');
    let sender = lines.next().unwrap_or("");
    (sender, lines.filter_map(parse_change).collect())
}

fn parse_change(line: &str) -> Option<Change> {
    let mut words = line.split(' ');
    let change = match words.next()? {
        "b" => Change::Bound {
            key: SessionKey::from_hex(words.next()?)?,
            state: parse_state(words.next()?)?,
            node: words.next()?.to_owned(),
        },
        "f" => Change::Forgot(SessionKey::from_hex(words.next()?)?),
        "t" => Change::Touched(words.map(SessionKey::from_hex).collect::<Option<_>>()?),
        "n" => Change::NodeState {
            node: words.next()?.to_owned(),
            state: NodeState::from_name(words.next()?)?,
        },
        _ => return None,
    };
    Some(change)
}

fn state_letter(state: SessionState) -> char {
    match state {
        SessionState::LoggedIn => 'L',
        SessionState::Anonymous => 'A',
    }
}

fn parse_state(letter: &str) -> Option<SessionState> {
    match letter {
        "L" => Some(SessionState::LoggedIn),
        "A" => Some(SessionState::Anonymous),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(hex: &str) -> SessionKey {
        SessionKey::from_hex(hex).unwrap()
    }

    #[test]
    fn every_change_reads_back_as_it_was_said() {
        let changes = vec![
            Change::Bound {
                key: key("00000000000000ff"),
                state: SessionState::LoggedIn,
                node: "web1".into(),
            },
            Change::Forgot(key("0123456789abcdef")),
            Change::Touched(vec![key("0000000000000001"), key("0000000000000002")]),
            Change::NodeState {
                node: "web-2".into(),
                state: NodeState::Draining,
            },
        ];
        let text = message("gw-a/42", &changes);
        assert_eq!(
            text,
            "gw-a/42\nb 00000000000000ff L web1\nf 0123456789abcdef\n\
             t 0000000000000001 0000000000000002\nn web-2 draining"
        );
        assert_eq!(parse_message(&text), ("gw-a/42", changes));
    }

    #[test]
    fn a_minutes_touches_go_out_in_messages_of_bounded_size_in_order() {
        let touched = |from: u64| {
            let keys = (from..from + 512).map(|n| key(&format!("{n:016x}")));
            Change::Touched(keys.collect())
        };
        let changes = vec![
            touched(0),
            Change::Forgot(key("0000000000000001")),
            touched(512),
            touched(1024),
        ];
        let sent = messages("gw-a/1", &changes);
        assert_eq!(sent.len(), 2);
        let read: Vec<Change> = sent.iter().flat_map(|m| parse_message(m).1).collect();
        assert_eq!(read, changes, "nothing lost, nothing reordered");
        assert!(messages("gw-a/1", &[]).is_empty());
    }

    #[test]
    fn a_gateway_knows_its_own_messages_and_no_one_elses() {
        let text = message("gw-a/1", &[Change::Forgot(key("0000000000000001"))]);
        assert!(sent_by(text.as_bytes(), "gw-a/1"));
        assert!(!sent_by(text.as_bytes(), "gw-a/12"));
        assert!(!sent_by(text.as_bytes(), "gw-a"));
        assert!(
            !sent_by(b"gw-a/1", "gw-a/1"),
            "a sender line alone is no message"
        );
    }

    #[test]
    fn lines_a_newer_gateway_adds_are_skipped_not_misread() {
        let (sender, changes) = parse_message("gw-b/1\nx something new\nf 0000000000000001\nb bad");
        assert_eq!(sender, "gw-b/1");
        assert_eq!(changes, [Change::Forgot(key("0000000000000001"))]);
    }

    #[test]
    fn a_session_value_names_its_state_node_and_gateway() {
        let value = session_value(SessionState::Anonymous, "web3", "gw-a");
        assert_eq!(value, "A web3 gw-a");
        assert_eq!(
            parse_session(&value),
            Some((SessionState::Anonymous, "web3", "gw-a"))
        );
        assert_eq!(parse_session("Q web3 gw-a"), None);
        assert_eq!(parse_session("L"), None);
    }

    #[test]
    fn keys_live_under_the_prefix_and_read_back() {
        let keys = Keys::new("site1:");
        let session = keys.session(key("00000000000000ab"));
        assert_eq!(session, "site1:s:00000000000000ab");
        assert_eq!(keys.session_of(&session), Some(key("00000000000000ab")));
        assert_eq!(keys.session_of("site2:s:00000000000000ab"), None);
        assert_eq!(keys.gateway("gw-a"), "site1:gw:gw-a");
    }
}

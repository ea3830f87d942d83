//! The `[[nodes]]`, `[data]` and `[offload]` readers: each upstream's name, address,
//! weight and state, the uniqueness of names and addresses across all of them, and that
//! some node can take new sessions. Apart from `check` because an upstream is
//! checked as a whole (its parts against each other's) rather than key by key.

use http::uri::Authority;

use super::check::{Checker, Section, Span};
use super::surge::MAX_ACTIVE;
use super::values::{node_name, parse_node_state, server_key, upstream_authority};
use super::{
    NodeState, OffloadConfig, UpstreamConfig, DEFAULT_OFFLOAD_PREFIX, DEFAULT_WEIGHT, MAX_NODES,
    MAX_WEIGHT,
};

const OFFLOAD_KEYS: &str = "url prefix probe";

const NODE_KEYS: &str = "name url weight state max_active low_priority_url";
// No `state`: the data server is not dealt sessions, so draining it means nothing,
// and disabling it would leave SCORM files nowhere to go.
const DATA_KEYS: &str = "name url";

/// An upstream while it is checked: a part is `None` when it was invalid (an
/// error is recorded), so uniqueness can still check the valid parts.
struct Upstream {
    key: String,
    name: Option<(String, Span)>,
    url: Option<(Authority, Span)>,
    weight: u32,
    state: NodeState,
    max_active: Option<usize>,
    low_priority: Option<(Authority, Span)>,
}

impl Upstream {
    fn build(self) -> Option<UpstreamConfig> {
        let ((name, _), (authority, _)) = (self.name?, self.url?);
        Some(UpstreamConfig {
            name,
            authority,
            weight: self.weight,
            state: self.state,
            max_active: self.max_active,
            low_priority: self.low_priority.map(|(authority, _)| authority),
        })
    }
}

impl Checker<'_> {
    /// `[offload]`: where the gateway fetches the files PHP nodes name with
    /// `X-Accel-Redirect`, and the only prefix it honours.
    pub(super) fn offload(&mut self, root: &Section) -> Option<OffloadConfig> {
        let s = self.open("offload".into(), root.get("offload"), OFFLOAD_KEYS);
        s.table?;
        self.require(&s, "url");
        let url = self.parsed(&s, "url", upstream_authority);
        let prefix = self.parsed(&s, "prefix", offload_prefix);
        let prefix = prefix.map_or_else(|| DEFAULT_OFFLOAD_PREFIX.to_owned(), |v| v.0);
        let probe = self.parsed(&s, "probe", |raw| offload_probe(raw, &prefix));
        Some(OffloadConfig {
            authority: url?.0,
            probe: probe.map(|v| v.0),
            prefix,
        })
    }

    /// The nodes and the data server, or `None` when any part of them is invalid
    /// (each problem is recorded).
    pub(super) fn upstreams(
        &mut self,
        root: &Section,
    ) -> Option<(Vec<UpstreamConfig>, UpstreamConfig)> {
        let nodes = self.nodes(root);
        let data = self.data(root);
        self.unique(&nodes.iter().chain(&data).collect::<Vec<_>>());
        let nodes: Vec<_> = nodes.into_iter().map(Upstream::build).collect();
        let data = data.and_then(Upstream::build);
        Some((nodes.into_iter().collect::<Option<_>>()?, data?))
    }

    fn nodes(&mut self, root: &Section) -> Vec<Upstream> {
        let missing = "at least one [[nodes]] block is required";
        let Some(v) = root.get("nodes") else {
            self.error("nodes", None, missing);
            return Vec::new();
        };
        let items = self.typed(root, "nodes", "an array of tables", |v| v.as_array());
        if items.as_ref().is_some_and(|(a, _)| a.is_empty()) {
            self.error("nodes", Some(v.span()), missing);
        }
        if items.as_ref().is_some_and(|(a, _)| a.len() > MAX_NODES) {
            let message = format!("at most {MAX_NODES} nodes (the table stores a node as 16 bits)");
            self.error("nodes", Some(v.span()), message);
        }
        let mut nodes = Vec::new();
        for (i, item) in items.iter().flat_map(|(a, _)| a.iter()).enumerate() {
            let s = self.open(format!("nodes[{i}]"), Some(item), NODE_KEYS);
            nodes.push(self.upstream(s, true));
        }
        self.some_node_active(&nodes, v.span());
        nodes
    }

    /// New sessions are dealt to active nodes only: with none, every new student
    /// (and every student whose node is disabled) would be turned away. A node
    /// whose `state` is invalid counts as active, so one typo is one error.
    fn some_node_active(&mut self, nodes: &[Upstream], span: Span) {
        if nodes.is_empty() || nodes.iter().any(|n| n.state == NodeState::Active) {
            return;
        }
        let message = "no node is \"active\", so no node can take new sessions: \
                       set state = \"active\" on at least one";
        self.error("nodes", Some(span), message);
    }

    fn data(&mut self, root: &Section) -> Option<Upstream> {
        if root.get("data").is_none() {
            let message = "missing required section [data] (the server for SCORM files)";
            self.error("data", None, message);
            return None;
        }
        let s = self.open("data".into(), root.get("data"), DATA_KEYS);
        Some(self.upstream(s, false))
    }

    /// `node` allows the keys only a `[[nodes]]` block has: `weight` and `state`.
    fn upstream(&mut self, s: Section, node: bool) -> Upstream {
        self.require(&s, "name");
        self.require(&s, "url");
        let name = self.parsed(&s, "name", node_name);
        let url = self.parsed(&s, "url", upstream_authority);
        let weight = node.then(|| self.int_in(&s, "weight", 1..=MAX_WEIGHT.into()));
        let weight = weight.flatten().map_or(DEFAULT_WEIGHT, |w| w as u32);
        let state = node.then(|| self.parsed(&s, "state", parse_node_state));
        let state = state.flatten().map_or(NodeState::Active, |v| v.0);
        let max_active = node.then(|| self.int_in(&s, "max_active", 0..=MAX_ACTIVE));
        let max_active = max_active.flatten().and_then(|n| usize::try_from(n).ok());
        let low_priority = node.then(|| self.parsed(&s, "low_priority_url", upstream_authority));
        Upstream {
            key: s.key,
            name,
            url,
            weight,
            state,
            max_active,
            low_priority: low_priority.flatten(),
        }
    }

    /// Names must be unique so logs and the admin API are unambiguous; addresses
    /// so that weights and session counts mean what they say.
    fn unique(&mut self, all: &[&Upstream]) {
        let names = all
            .iter()
            .map(|u| u.name.as_ref().map(|(n, s)| (n.clone(), s.clone())));
        self.no_duplicates(all, "name", "name", names.collect());
        let addrs = all
            .iter()
            .map(|u| u.url.as_ref().map(|(a, s)| (server_key(a), s.clone())));
        self.no_duplicates(all, "url", "address", addrs.collect());
        self.low_priority_apart(all);
    }

    /// A `low_priority_url` is a pool of its own: at any upstream's `url`, or at
    /// another node's `low_priority_url`, its requests would run at that pool's
    /// priority, or on another machine that does not hold the node's sessions.
    fn low_priority_apart(&mut self, all: &[&Upstream]) {
        let urls: Vec<(String, &str)> = (all.iter())
            .filter_map(|u| Some((server_key(&u.url.as_ref()?.0), u.key.as_str())))
            .collect();
        let mut lows: Vec<(String, &str)> = Vec::new();
        for u in all {
            let Some((low, span)) = &u.low_priority else {
                continue;
            };
            let low_key = server_key(low);
            let taken = (urls.iter().map(|(key, at)| (key, format!("{at}.url"))))
                .chain(
                    lows.iter()
                        .map(|(key, at)| (key, format!("{at}.low_priority_url"))),
                )
                .find(|(key, _)| **key == low_key);
            if let Some((_, at)) = taken {
                let message = format!(
                    "{low} is already {at}: the low-priority address must be a PHP pool of \
                     its own on this node"
                );
                self.error(
                    format!("{}.low_priority_url", u.key),
                    Some(span.clone()),
                    message,
                );
            }
            lows.push((low_key, &u.key));
        }
    }

    /// `values[i]` is `all[i]`'s `field`, `None` where it was invalid.
    fn no_duplicates(
        &mut self,
        all: &[&Upstream],
        field: &str,
        what: &str,
        values: Vec<Option<(String, Span)>>,
    ) {
        for (i, (u, v)) in all.iter().zip(&values).enumerate() {
            let Some((value, span)) = v else { continue };
            let same = |e: &Option<(String, Span)>| e.as_ref().is_some_and(|(x, _)| x == value);
            if let Some(first) = values[..i].iter().position(same) {
                let message = format!(
                    "duplicate {what} {value:?} (already used by {})",
                    all[first].key
                );
                self.error(format!("{}.{field}", u.key), Some(span.clone()), message);
            }
        }
    }
}

/// `offload.probe`: a file under `prefix`, in the same plain characters, that the
/// export must answer `2xx`: the gateway asks the export only for paths under the
/// prefix, and a probe elsewhere would prove nothing about the alias that serves
/// the files.
fn offload_probe(raw: &str, prefix: &str) -> Result<String, String> {
    let plain = raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/-._~".contains(&b));
    let rest = raw.strip_prefix(prefix).unwrap_or_default();
    let segments_ok = rest.split('/').all(|seg| !matches!(seg, "" | "." | ".."));
    if plain && !rest.is_empty() && segments_ok {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "{raw:?} must be a file under offload.prefix ({prefix:?}) in plain characters, \
like \"{prefix}filedir/probe.txt\": the export must answer it 2xx"
        ))
    }
}

/// `offload.prefix`: a path that starts and ends with `/`, in plain characters, as
/// the key of `$CFG->xsendfilealiases` is written (`'/dataroot/'`).
fn offload_prefix(raw: &str) -> Result<String, String> {
    let plain = raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/-._~".contains(&b));
    let segments_ok = raw
        .trim_matches('/')
        .split('/')
        .all(|seg| !matches!(seg, "" | "." | ".."));
    if raw.len() > 1 && raw.starts_with('/') && raw.ends_with('/') && plain && segments_ok {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "{raw:?} must be a path that starts and ends with \"/\", like \"/dataroot/\" \
(the key of $CFG->xsendfilealiases)"
        ))
    }
}

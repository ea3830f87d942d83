//! [`Cluster`]: the stand-in Moodle cluster (PHP nodes plus the data server sharing
//! one registry) and the gateway config that fronts it.

use std::io;

use super::{Registry, Role, StandIn, StandInConfig};

/// `web1..webN` and `data`, sharing one [`Registry`]: a Moodle cluster with node-local
/// sessions, the setup where a misrouted request costs a student their login.
pub struct Cluster {
    nodes: Vec<StandIn>,
    data: StandIn,
    registry: Registry,
    site_path: String,
    cookie: String,
}

impl Cluster {
    /// Spawns `nodes` PHP nodes and the data server. Call inside a Tokio runtime.
    pub fn spawn(nodes: usize, site_path: &str, cookie: &str) -> io::Result<Cluster> {
        let registry = Registry::new();
        let spawn = |name: String, role| {
            let (site_path, cookie) = (site_path.to_owned(), cookie.to_owned());
            StandIn::spawn(
                StandInConfig {
                    name,
                    site_path,
                    cookie,
                    role,
                },
                registry.clone(),
            )
        };
        let nodes = (1..=nodes).map(|i| spawn(format!("web{i}"), Role::Node));
        let nodes = nodes.collect::<io::Result<Vec<_>>>()?;
        let data = spawn("data".to_owned(), Role::Data)?;
        let (site_path, cookie) = (site_path.to_owned(), cookie.to_owned());
        Ok(Cluster {
            nodes,
            data,
            registry,
            site_path,
            cookie,
        })
    }

    /// The PHP nodes, `web1` first (the gateway's config order).
    pub fn nodes(&self) -> &[StandIn] {
        &self.nodes
    }

    /// The data server.
    pub fn data(&self) -> &StandIn {
        &self.data
    }

    /// A node or the data server by name.
    pub fn by_name(&self, name: &str) -> Option<&StandIn> {
        self.nodes
            .iter()
            .chain([&self.data])
            .find(|s| s.name() == name)
    }

    /// The cluster's session registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// See [`Registry::lost_sessions`].
    pub fn lost_sessions(&self) -> u64 {
        self.registry.lost_sessions()
    }

    /// The wwwroot sub-path the stand-ins serve.
    pub fn site_path(&self) -> &str {
        &self.site_path
    }

    /// The session cookie name.
    pub fn cookie(&self) -> &str {
        &self.cookie
    }

    /// A gateway config for this cluster. Every generated setting is a top-level or
    /// dotted key (`site.path`, `session.cookie`, `admin.token`), so `extra` is placed
    /// after them, before `[[nodes]]`, and may hold top-level keys
    /// (`trusted_proxies = ["127.0.0.1"]`), dotted keys of any section
    /// (`session.balance = "least-sessions"`, `timeouts.response_headers = "1s"`) or
    /// whole `[timeouts]` tables; not `[site]`, `[session]` or `[admin]` headers.
    pub fn config_toml(&self, listen: &str, admin: Option<(&str, &str)>, extra: &str) -> String {
        let mut toml = format!(
            "listen = {listen:?}\nsite.path = {:?}\nsession.cookie = {:?}\n",
            self.site_path, self.cookie
        );
        if let Some((listen, token)) = admin {
            toml += &format!("admin.listen = {listen:?}\nadmin.token = {token:?}\n");
        }
        toml += extra;
        toml += "\n";
        for node in &self.nodes {
            toml += &format!(
                "\n[[nodes]]\nname = {:?}\nurl = \"http://{}\"\n",
                node.name(),
                node.addr()
            );
        }
        toml += &format!(
            "\n[data]\nname = {:?}\nurl = \"http://{}\"\n",
            self.data.name(),
            self.data.addr()
        );
        toml
    }
}

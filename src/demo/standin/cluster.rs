//! [`Cluster`]: the stand-in Moodle cluster (PHP nodes plus the data server sharing
//! one registry) and the gateway config that fronts it.

use std::io;

use super::{Registry, Role, StandIn, StandInConfig, ALIAS};

/// `web1..webN` and `data`, sharing one [`Registry`]: a Moodle cluster with node-local
/// sessions, the setup where a misrouted request costs a student their login. With
/// [`Cluster::spawn_offloaded`] also the data server's file export, and nodes that
/// hand files over to it.
pub struct Cluster {
    nodes: Vec<StandIn>,
    data: StandIn,
    export: Option<StandIn>,
    registry: Registry,
    site_path: String,
    cookie: String,
}

impl Cluster {
    /// Spawns `nodes` PHP nodes and the data server. Call inside a Tokio runtime.
    pub fn spawn(nodes: usize, site_path: &str, cookie: &str) -> io::Result<Cluster> {
        Self::spawn_as(nodes, site_path, cookie, false)
    }

    /// [`Cluster::spawn`], set up for the file offload as the book recommends with
    /// node-local sessions: every node has `$CFG->xsendfile`, and the data server
    /// has a file export; [`Cluster::config_toml`] then writes `[offload]`.
    pub fn spawn_offloaded(nodes: usize, site_path: &str, cookie: &str) -> io::Result<Cluster> {
        Self::spawn_as(nodes, site_path, cookie, true)
    }

    fn spawn_as(nodes: usize, site_path: &str, cookie: &str, offload: bool) -> io::Result<Cluster> {
        let registry = Registry::new();
        let (site_path, cookie) = (site_path.to_owned(), cookie.to_owned());
        let data = member(&registry, &site_path, &cookie, "data", Role::Data, false)?;
        let export = offload
            .then(|| {
                member(
                    &registry,
                    &site_path,
                    &cookie,
                    "export",
                    Role::Export,
                    false,
                )
            })
            .transpose()?;
        let mut cluster = Cluster {
            nodes: Vec::with_capacity(nodes),
            data,
            export,
            registry,
            site_path,
            cookie,
        };
        for i in 1..=nodes {
            cluster.add_node(&format!("web{i}"))?;
        }
        Ok(cluster)
    }

    /// Spawns one more PHP node sharing the cluster's registry, site path and cookie,
    /// for tests that add a node to the gateway's config at run time. It comes last in
    /// [`Cluster::nodes`] and [`Cluster::config_toml`]. A name already in the cluster
    /// is refused (`InvalidInput`): two nodes of one name would share their sessions,
    /// and the gateway rejects duplicate names anyway. Call inside a Tokio runtime.
    pub fn add_node(&mut self, name: &str) -> io::Result<&StandIn> {
        if self.by_name(name).is_some() {
            let taken = format!("a stand-in named {name:?} is already in the cluster");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, taken));
        }
        let node = self.php_node(name)?;
        self.nodes.push(node);
        Ok(self.nodes.last().expect("just pushed"))
    }

    /// A second server of node `name`, as a second PHP-FPM pool of the same node
    /// (`low_priority_url`): it shares the node's sessions, so a student may be
    /// served by either. Not in [`Cluster::nodes`] nor the config; the caller
    /// keeps it. Call inside a Tokio runtime.
    pub fn low_pool(&self, name: &str) -> io::Result<StandIn> {
        self.php_node(name)
    }

    /// A PHP node named `name`, sharing the cluster's registry, site path, cookie
    /// and file offload.
    fn php_node(&self, name: &str) -> io::Result<StandIn> {
        let offload = self.export.is_some();
        member(
            &self.registry,
            &self.site_path,
            &self.cookie,
            name,
            Role::Node,
            offload,
        )
    }

    /// The PHP nodes, `web1` first (the gateway's config order).
    pub fn nodes(&self) -> &[StandIn] {
        &self.nodes
    }

    /// The data server.
    pub fn data(&self) -> &StandIn {
        &self.data
    }

    /// The data server's file export, in a cluster set up for the offload.
    pub fn export(&self) -> Option<&StandIn> {
        self.export.as_ref()
    }

    /// A node or the data server by name.
    pub fn by_name(&self, name: &str) -> Option<&StandIn> {
        self.nodes
            .iter()
            .chain([&self.data])
            .find(|s| s.name() == name)
    }

    /// Switches site maintenance on every stand-in, data server included: Moodle keeps
    /// `climaintenance.html` in the shared dataroot, so maintenance is never per node.
    pub fn set_maintenance(&self, on: bool) {
        for standin in self.nodes.iter().chain([&self.data]) {
            standin.set_maintenance(on);
        }
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
        toml + &self.upstreams_toml()
    }

    /// The `[[nodes]]` blocks, `[data]` and, set up for the offload, `[offload]`:
    /// the end of a config for this cluster.
    pub fn upstreams_toml(&self) -> String {
        let mut toml = String::new();
        for node in &self.nodes {
            toml += "\n";
            toml += &nodes_block(node);
        }
        toml += &format!(
            "\n[data]\nname = {:?}\nurl = \"http://{}\"\n",
            self.data.name(),
            self.data.addr()
        );
        if let Some(export) = &self.export {
            toml += &format!(
                "\n[offload]\nurl = \"http://{}\"\nprefix = {ALIAS:?}\n",
                export.addr()
            );
        }
        toml
    }

    /// Just the `[[nodes]]` block (name and url) of PHP node `name`, as
    /// [`Cluster::config_toml`] writes it: for a test that writes a config without one
    /// node and adds the block later. `None` for the data server or an unknown name.
    pub fn node_toml(&self, name: &str) -> Option<String> {
        let node = self.nodes.iter().find(|n| n.name() == name)?;
        Some(nodes_block(node))
    }
}

fn nodes_block(node: &StandIn) -> String {
    format!(
        "[[nodes]]\nname = {:?}\nurl = \"http://{}\"\n",
        node.name(),
        node.addr()
    )
}

/// One stand-in of the cluster.
fn member(
    registry: &Registry,
    site_path: &str,
    cookie: &str,
    name: &str,
    role: Role,
    xsendfile: bool,
) -> io::Result<StandIn> {
    let config = StandInConfig {
        name: name.to_owned(),
        site_path: site_path.to_owned(),
        cookie: cookie.to_owned(),
        role,
        xsendfile,
    };
    StandIn::spawn(config, registry.clone())
}

//! The config the demo runs, written as an admin would write it for the set-up the
//! book recommends to a site without a shared session store: node-local sessions,
//! the file offload through each student's own node, and the route cookie. It is
//! the text `demo --write-config` saves, and the demo parses it with `check`'s own
//! rules, so the demo can never run a set-up `check` refuses.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::{Config, ConfigEnv, ConfigErrors};
use crate::demo::standin::Cluster;

/// With `--surge`: each stand-in node's PHP workers and how long a page takes.
pub(super) const SURGE_WORKERS: usize = 3;
pub(super) const SURGE_PAGE: Duration = Duration::from_millis(400);
/// With `--surge`: the gateway's cap per node, one under the workers, as the book
/// sizes it (a probe always finds a worker).
const SURGE_MAX_ACTIVE: usize = SURGE_WORKERS - 1;

/// What the config says besides the cluster's addresses.
pub(super) struct Setup<'a> {
    pub(super) public: SocketAddr,
    pub(super) admin: SocketAddr,
    pub(super) token: &'a str,
    pub(super) route_secret: &'a str,
    pub(super) surge: bool,
}

/// The address students use: the listener's, with a loopback host for an
/// unspecified one (`0.0.0.0` is nobody's wwwroot).
pub(super) fn wwwroot(public: SocketAddr) -> String {
    let host = match public.ip() {
        ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
        ip if ip.is_ipv6() => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("http://{host}:{}", public.port())
}

/// The config text for `cluster`.
pub(super) fn config_text(cluster: &Cluster, setup: &Setup<'_>) -> String {
    let Setup {
        public,
        admin,
        token,
        route_secret,
        surge,
    } = setup;
    let mut toml = format!(
        "# The config `moodle-gateway demo` runs: the stand-in site's addresses change at every\n\
         # run. `moodle-gateway check --config THIS` judges it; while the demo runs,\n\
         # `moodle-gateway doctor --config THIS` asks its stand-ins.\n\
         listen = \"{public}\"\n\
         \n[site]\n\
         # The stand-ins' $CFG->wwwroot: Moodle's links and redirects name it.\n\
         wwwroot = \"{}\"\n\
         \n[admin]\n\
         listen = \"{admin}\"\n\
         token = \"{token}\"\n\
         \n[session]\n\
         # Each stand-in node keeps its own sessions, as PHP's file sessions do.\n\
         store = \"node-local\"\n\
         \n[state]\n\
         # The demo's sessions die with it.\n\
         file = \"\"\n\
         \n[route_cookie]\n\
         # Sends a student home even if the gateway forgot them (a crash).\n\
         secret = \"{route_secret}\"\n",
        wwwroot(*public)
    );
    if *surge {
        toml += &format!(
            "\n[surge]\n\
             # The stand-in nodes have {SURGE_WORKERS} PHP workers each, {} ms a page.\n\
             max_active = {SURGE_MAX_ACTIVE}\n\
             room_opens_at = \"2s\"\n",
            SURGE_PAGE.as_millis()
        );
    }
    toml += "\n# The stand-ins: PHP nodes with $CFG->xsendfile = 'X-Accel-Redirect', the data\n\
             # server, and its file export, which sends the files the nodes name.\n";
    toml + &cluster.upstreams_toml()
}

/// The config as `check` reads it: refused, it is a bug of the demo's.
pub(super) fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let base = std::path::Path::new(".");
    Config::parse_for_site(text, base, ConfigEnv::default()).map(|(config, _warnings)| config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_student_s_address_is_never_the_unspecified_one() {
        let any = SocketAddr::from(([0, 0, 0, 0], 8080));
        assert_eq!(wwwroot(any), "http://127.0.0.1:8080");
        let six = "[::1]:8080".parse().unwrap();
        assert_eq!(wwwroot(six), "http://[::1]:8080");
    }

    #[tokio::test]
    async fn the_demo_s_config_is_one_check_accepts_with_and_without_a_surge() {
        let cluster = Cluster::spawn_offloaded(2, "", "MoodleSession").unwrap();
        for surge in [false, true] {
            let setup = Setup {
                public: SocketAddr::from(([127, 0, 0, 1], 8080)),
                admin: SocketAddr::from(([127, 0, 0, 1], 9090)),
                token: &"t".repeat(32),
                route_secret: &"s".repeat(64),
                surge,
            };
            let text = config_text(&cluster, &setup);
            let config = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert!(config.offload.is_some());
        }
    }
}

//! The data server's file export (`[offload]`) as an upstream the gateway watches:
//! probed on the nodes' timer and by their `rise`/`fall`, so `/nodes`, the
//! dashboard and `/metrics` say whether it is up, and an export that goes down is
//! one log line rather than a warning per file.
//!
//! What a probe asks: a `GET` of something every export answers without a student's
//! file. By default the prefix itself (`/dataroot/`): a plain file server answers a
//! directory it does not list with `403` or `404`, and any answer below `500` proves
//! that it is listening and speaking HTTP, which is all the gateway can know without
//! a file name. With `offload.probe`, a file the admin put under the prefix must
//! answer `2xx`, which also proves the dataroot is mounted where the alias points.
//! Down is what a student would suffer: no connection, no answer within
//! `health.timeout`, or a `5xx` (a `503` too: an export has no maintenance page).
//!
//! Why probes only, no passive marks from fetches: the export has no stand-in, so a
//! mark changes nothing a student gets (every file is still fetched from it, and a
//! fetch that works is served even while it is marked down: a wrong `probe` path must
//! never cost a student a file). The mark is what an admin reads, and the probe's
//! rhythm is the one that says "down" and "up again" exactly once each.

use std::sync::Arc;

use super::health::{self, Change, Health, Probe};
use crate::config::{HealthConfig, OffloadConfig, StatusRange};

/// The export as the gateway watches it; shared by the settings that name the same
/// export and probe, so a reload keeps its health.
#[derive(Debug)]
pub struct Export {
    /// `host:port`, as the config names it.
    pub authority: String,
    /// The path probed.
    pub probe: String,
    /// Whether `probe` names a file (`2xx` only is up) or the prefix (below `500`).
    file: bool,
    /// Up or down, since when, and what the last probe saw.
    pub health: Health,
}

impl Export {
    /// The export `[offload]` names; `previous` is kept when it is the same export
    /// probed the same way.
    pub fn new(config: &OffloadConfig, previous: Option<&Arc<Export>>) -> Arc<Self> {
        let authority = config.authority.to_string();
        let probe = config
            .probe
            .clone()
            .unwrap_or_else(|| config.prefix.clone());
        let same = |p: &&Arc<Export>| p.authority == authority && p.probe == probe;
        if let Some(kept) = previous.filter(same) {
            return kept.clone();
        }
        Arc::new(Self {
            authority,
            probe,
            file: config.probe.is_some(),
            health: Health::default(),
        })
    }

    /// `http://host:port`, as logs and the admin views name it.
    pub fn url(&self) -> String {
        format!("http://{}", self.authority)
    }

    /// The nodes' probe settings with this export's path and rule: no `Host` of the
    /// site's (the export is no Moodle), and its own healthy statuses.
    fn probe_settings(&self, nodes: &HealthConfig) -> HealthConfig {
        let (low, high) = if self.file { (200, 299) } else { (100, 499) };
        HealthConfig {
            path: self.probe.clone(),
            host: None,
            statuses: vec![StatusRange { low, high }],
            ..nodes.clone()
        }
    }

    /// Probes the export once and applies the result.
    pub async fn probe(&self, client: &health::ProbeClient, nodes: &HealthConfig) {
        let settings = self.probe_settings(nodes);
        let seen = health::probe(client, &self.authority, &settings).await;
        self.record(seen, nodes);
    }

    /// Applies one probe's result, logging a change of state once: the export going
    /// down (WARN, with what students get) and coming back (INFO).
    fn record(&self, seen: Probe, nodes: &HealthConfig) {
        // Retry-After on a 503 is Moodle's maintenance page, not an export's.
        let seen = match seen {
            Probe::Maintenance => Probe::Failed("answered 503 Service Unavailable".into()),
            other => other,
        };
        self.health.note_probe(&seen);
        let export = self.url();
        match &seen {
            Probe::Healthy(_) => {
                if self.health.success(nodes.rise) == Change::Up {
                    tracing::info!(
                        %export,
                        "the data server's file export is up again after {} good probes: \
                         offloaded files are served",
                        nodes.rise
                    );
                }
            }
            Probe::Failed(reason) => {
                if self.health.failure(nodes.fall) == Change::Down {
                    tracing::warn!(
                        %export,
                        probe = %self.probe,
                        "the data server's file export is down ({reason}): students get 502 \
                         for every offloaded file (SCORM content, resources) until it is back"
                    );
                }
            }
            Probe::NoVerdict(reason) => {
                tracing::warn!(%export, "probe not sent, not counted: {reason}");
            }
            Probe::Maintenance => unreachable!("mapped to a failure above"),
        }
    }
}

/// Probes the export of the current settings each `health.interval` until `stop`
/// fires; `current` is asked every round, so a reload that adds, changes or removes
/// `[offload]` takes effect on the next one.
pub async fn run(
    current: impl Fn() -> (HealthConfig, Option<Arc<Export>>),
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let client = health::probe_client();
    // It starts up, as the nodes do: the first probe comes one interval after start.
    let mut wait = current().0.interval;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        let (nodes, export) = current();
        if let Some(export) = export {
            tokio::select! {
                () = export.probe(&client, &nodes) => {}
                _ = stop.changed() => return,
            }
        }
        wait = nodes.interval;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::StatusCode;

    use super::*;

    fn offload(probe: Option<&str>) -> OffloadConfig {
        OffloadConfig {
            authority: "10.0.0.5:8081".parse().unwrap(),
            prefix: "/dataroot/".into(),
            probe: probe.map(str::to_owned),
        }
    }

    fn nodes() -> HealthConfig {
        HealthConfig {
            path: "/theme/image.php".into(),
            host: Some("moodle.example.edu".into()),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 2,
            statuses: vec![StatusRange {
                low: 200,
                high: 200,
            }],
        }
    }

    #[test]
    fn the_prefix_is_up_on_any_answer_below_500_and_a_probe_file_only_on_2xx() {
        let prefix = Export::new(&offload(None), None).probe_settings(&nodes());
        assert_eq!(
            (prefix.path.as_str(), prefix.host.as_deref()),
            ("/dataroot/", None)
        );
        assert!(prefix.accepts(404) && prefix.accepts(403) && !prefix.accepts(500));
        let file = Export::new(&offload(Some("/dataroot/filedir/probe.txt")), None);
        let file = file.probe_settings(&nodes());
        assert_eq!(file.path, "/dataroot/filedir/probe.txt");
        assert!(file.accepts(200) && !file.accepts(404));
    }

    #[test]
    fn a_reload_keeps_the_health_of_the_same_export_probed_the_same_way() {
        let first = Export::new(&offload(None), None);
        first.health.failure(1);
        let same = Export::new(&offload(None), Some(&first));
        assert!(Arc::ptr_eq(&first, &same) && !same.health.is_up());
        let other = Export::new(&offload(Some("/dataroot/p")), Some(&first));
        assert!(other.health.is_up(), "another probe starts afresh");
    }

    #[test]
    fn a_503_with_retry_after_is_a_failure_for_an_export() {
        let export = Export::new(&offload(None), None);
        let mut settings = nodes();
        settings.fall = 1;
        export.record(Probe::Maintenance, &settings);
        assert!(!export.health.is_up());
        let said = export.health.last_probe().unwrap().said;
        assert_eq!(said, "answered 503 Service Unavailable");
        export.record(Probe::Healthy(StatusCode::NOT_FOUND), &settings);
        export.record(Probe::Healthy(StatusCode::NOT_FOUND), &settings);
        assert!(export.health.is_up(), "rise good probes bring it back");
    }
}

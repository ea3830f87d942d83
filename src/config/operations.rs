//! The `[health]` and `[state]` readers: how upstreams are probed, and where the
//! affinity table is snapshotted. Both only tune how the gateway runs, never
//! where a request goes, so every key has a default and both sections are optional.

use std::time::Duration;

use toml::de::DeValue;

use super::check::{integer, Checker, Section};
use super::values::{health_path, state_file, status_class, status_code};
use super::{
    AccessLogConfig, AccessLogFormat, AccessLogTo, HealthConfig, SiteConfig, StateConfig,
    StatusRange, DEFAULT_FALL, DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_PATH,
    DEFAULT_HEALTH_TIMEOUT, DEFAULT_RISE, DEFAULT_SAVE_EVERY, DEFAULT_STATE_FILE,
};

const HEALTH_KEYS: &str = "path host interval timeout rise fall statuses";
const STATE_KEYS: &str = "file save_every";
const ACCESS_LOG_KEYS: &str = "to format";

/// `statuses` default: only a plain success; a redirect usually means the probe
/// hit a login page, not a working site.
const DEFAULT_STATUSES: [StatusRange; 1] = [StatusRange {
    low: 200,
    high: 200,
}];

impl Checker<'_> {
    /// `[access_log]`: optional, off unless `to` says where.
    pub(super) fn access_log(&mut self, root: &Section) -> AccessLogConfig {
        let s = self.open("access_log".into(), root.get("access_log"), ACCESS_LOG_KEYS);
        let to = self.parsed(&s, "to", access_log_to);
        let format = self.parsed(&s, "format", access_log_format);
        AccessLogConfig {
            to: to.map_or(AccessLogTo::Off, |v| v.0),
            format: format.map_or(AccessLogFormat::Combined, |v| v.0),
        }
    }

    /// The probe goes to the site's own path with the site's own `Host` unless told
    /// otherwise: Moodle answers any other host with a redirect to wwwroot.
    pub(super) fn health(&mut self, root: &Section, site: &SiteConfig) -> HealthConfig {
        let s = self.open("health".into(), root.get("health"), HEALTH_KEYS);
        let path = self.parsed(&s, "path", health_path);
        let host = self.parsed(&s, "host", health_host);
        let (interval, timeout) = self.probe_timing(&s);
        let rise = self
            .int_in(&s, "rise", 1..=100)
            .map_or(DEFAULT_RISE, |n| n as u32);
        let fall = self
            .int_in(&s, "fall", 1..=100)
            .map_or(DEFAULT_FALL, |n| n as u32);
        HealthConfig {
            path: path.map_or_else(|| format!("{}{DEFAULT_HEALTH_PATH}", site.path), |v| v.0),
            host: host.map(|v| v.0).or_else(|| site.hosts.first().cloned()),
            interval,
            timeout,
            rise,
            fall,
            statuses: self.statuses(&s),
        }
    }

    /// `interval` and `timeout`. A probe that outlives the interval would overlap
    /// the next one, and a slow node would then carry several probes at once; the
    /// error blames the key that was written (an unset one is its default).
    fn probe_timing(&mut self, s: &Section) -> (Duration, Duration) {
        let interval = self.duration_at(s, "interval");
        let timeout = self.duration_at(s, "timeout");
        let written = |name| s.get(name).is_some();
        let i = interval.clone().map_or(DEFAULT_HEALTH_INTERVAL, |v| v.0);
        let t = timeout.clone().map_or(DEFAULT_HEALTH_TIMEOUT, |v| v.0);
        let invalid = (written("interval") && interval.is_none())
            || (written("timeout") && timeout.is_none());
        if t <= i || invalid {
            return (i, t);
        }
        let d = |d| humantime::format_duration(d).to_string();
        let overlap = "probes must not overlap, so a probe must end before the next starts";
        match timeout {
            Some((_, span)) => {
                let message = format!(
                    "{} is longer than health.interval ({}): {overlap}",
                    d(t),
                    d(i)
                );
                self.error(s.key("timeout"), Some(span), message);
            }
            None => {
                let message = format!(
                    "{} is shorter than health.timeout ({}, its default): {overlap}; lower timeout too",
                    d(i),
                    d(t)
                );
                self.error(s.key("interval"), interval.map(|v| v.1), message);
            }
        }
        (i, t)
    }

    /// Each item is a status (`200`) or a class (`"2xx"`); each bad one is
    /// reported on its own index.
    fn statuses(&mut self, s: &Section) -> Vec<StatusRange> {
        let Some((items, span)) = self.typed(s, "statuses", "an array", |v| v.as_array()) else {
            return DEFAULT_STATUSES.to_vec();
        };
        if items.is_empty() {
            let message = "must not be empty: list at least one status, like [200]";
            self.error(s.key("statuses"), Some(span), message);
        }
        let mut ranges = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let range = match item.get_ref() {
                DeValue::String(raw) => status_class(raw),
                v => match integer(v) {
                    Some(n) => status_code(n),
                    None => Err(format!(
                        "expected a status (like 200) or a class (like \"2xx\"), found {}",
                        v.type_str()
                    )),
                },
            };
            match range {
                Ok(r) => ranges.push(r),
                Err(m) => self.error(format!("{}[{i}]", s.key("statuses")), Some(item.span()), m),
            }
        }
        ranges
    }

    pub(super) fn state(&mut self, root: &Section) -> StateConfig {
        let s = self.open("state".into(), root.get("state"), STATE_KEYS);
        let file = self.parsed(&s, "file", state_file);
        StateConfig {
            file: file.map_or_else(|| Some(DEFAULT_STATE_FILE.into()), |v| v.0),
            save_every: self.duration(&s, "save_every", DEFAULT_SAVE_EVERY),
        }
    }
}

/// `health.host`: a host name with an optional port, as a `Host` header carries it.
fn health_host(raw: &str) -> Result<String, String> {
    let authority = raw.parse::<http::uri::Authority>();
    let plain = authority.is_ok_and(|a| a.as_str() == raw && !raw.contains('@'));
    if plain && !raw.is_empty() {
        Ok(raw.to_owned())
    } else {
        Err(format!(
"{raw:?} is not a host name (like \"moodle.example.edu\" or \"moodle.example.edu:8443\")"
))
    }
}

fn access_log_to(raw: &str) -> Result<AccessLogTo, String> {
    match raw {
        "off" => Ok(AccessLogTo::Off),
        "stderr" => Ok(AccessLogTo::Stderr),
        "" => Err("must not be empty: use \"off\", \"stderr\" or a file path".into()),
        _ if raw.ends_with('/') => Err(format!(
            "{raw:?} names a directory: name the file, like \"{raw}access.log\""
        )),
        _ if raw.contains('\0') => Err(format!("{raw:?} contains a NUL character")),
        _ => Ok(AccessLogTo::File(raw.into())),
    }
}

fn access_log_format(raw: &str) -> Result<AccessLogFormat, String> {
    match raw {
        "combined" => Ok(AccessLogFormat::Combined),
        "json" => Ok(AccessLogFormat::Json),
        _ => Err(format!(
            "{raw:?} is not a format: use \"combined\" or \"json\""
        )),
    }
}

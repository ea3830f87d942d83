//! What one file fetched from the data server's export teaches: counted by what came
//! of it, and said in the log at most every few seconds, or not at all while the
//! export is marked down (its probes said so, once).
//!
//! Why here: the fetch is `http`'s, the export's health `cluster`'s, and which paths
//! are Moodle's local cache `moodle`'s; this is where the three meet.

use std::time::Duration;

use http::header::HeaderValue;
use http::Response;

use super::{Gateway, Settings};
use crate::error::GatewayError;
use crate::http::body::IdleLimited;
use crate::http::upstream::pool::NodeBody;
use crate::logs::Every;
use crate::metrics::Fetched;
use crate::moodle;

/// The export failed a file while its probes still pass: one line per interval,
/// with the count of the rest (a class of 300 opening one SCORM package at once).
static FAILED: Every = Every::new(Duration::from_secs(10));
/// A file the pool does not have: a line per interval, naming the first path.
static NOT_FOUND: Every = Every::new(Duration::from_secs(10));
/// A theme or font file from Moodle's local cache the export does not serve: the
/// site's config is wrong, and it stays wrong until an admin changes it, so once an
/// hour is enough to be seen and not so often as to bury the rest.
static LOCALCACHE: Every = Every::new(Duration::from_secs(3600));

impl Gateway {
    /// Counts and logs the fetch of the file `redirect` named; a failure while the
    /// export is marked down becomes [`GatewayError::FileExportDown`], so the student's
    /// page says why.
    pub(super) fn watched(
        &self,
        settings: &Settings,
        prefix: &str,
        redirect: &HeaderValue,
        served: Result<Response<IdleLimited<NodeBody>>, GatewayError>,
    ) -> Result<Response<IdleLimited<NodeBody>>, GatewayError> {
        let Some(export) = settings.export.as_deref() else {
            return served;
        };
        let meters = self.metrics.export();
        let error = match served {
            Ok(file) => {
                meters.fetched(Fetched::Served);
                return Ok(file);
            }
            Err(error) => error,
        };
        let path = redirect.to_str().unwrap_or_default();
        let url = export.url();
        let fetched = match error {
            GatewayError::FileNotOnDataServer => {
                meters.fetched(Fetched::NotFound);
                let under_alias = path.strip_prefix(prefix).unwrap_or_default();
                if moodle::in_default_localcache(under_alias) {
                    if let Some(held_back) = LOCALCACHE.allow() {
                        tracing::warn!(
                            export = %url,
                            path,
                            held_back,
                            "a node accelerated a file from $CFG->localcachedir inside the \
                             dataroot, and the file export does not serve it: theme images \
                             and fonts answer 404. Set $CFG->localcachedir outside the \
                             dataroot on every node (local disk, as Moodle recommends), or \
                             have the export serve {prefix}localcache/ too"
                        );
                    }
                } else if let Some(held_back) = NOT_FOUND.allow() {
                    tracing::warn!(export = %url, path, held_back, "the file export has no such file");
                }
                return Err(error);
            }
            GatewayError::FileExportUnreachable => Fetched::Unreachable,
            GatewayError::FileExportTimeout => Fetched::Timeout,
            GatewayError::FileExportFailed => Fetched::Failed,
            // The node's fault (an unusable path), logged where it was refused.
            other => return Err(other),
        };
        meters.fetched(fetched);
        if !export.health.is_up() {
            return Err(GatewayError::FileExportDown);
        }
        if let Some(held_back) = FAILED.allow() {
            tracing::warn!(export = %url, path, held_back, "file offload failed: {error}");
        }
        Err(error)
    }
}

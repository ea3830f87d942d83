//! The affinity table across restarts: loaded from the snapshot file at start,
//! written to it every `state.save_every` and once more at shutdown.
//!
//! Why: a node that still holds a session sets no new cookie, so a gateway that
//! forgot its table could never relearn it; with node-local sessions a plain
//! restart would log every student out. Why it never stops the gateway: a
//! snapshot is an optimisation of routing, so a missing, corrupt or foreign file is
//! reported and the gateway starts with an empty table, and a failed write is
//! logged and tried again next time.
//!
//! The snapshot names nodes, not ids, so it survives a config whose node order
//! changed; sessions of a node no longer configured are left out and dealt afresh.
//! It holds the table's key secret (the keys mean nothing without it), so the file
//! is written readable by the gateway's user only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::affinity::{AffinityTable, Clock, Limits};
use crate::gateway::Gateway;
use crate::snapshot::{self, Snapshot, SnapshotError};

/// What [`open`] found: the table to start with (keyed with the snapshot's secret
/// when one could be read), the snapshot to restore once node ids exist, and where
/// to save from now on.
#[derive(Debug)]
pub struct Opened {
    /// The (still empty) table.
    pub table: AffinityTable,
    /// The snapshot read, if any.
    pub snapshot: Option<Snapshot>,
    /// Where to save: the configured file, unless it is not ours to overwrite.
    pub save_to: Option<PathBuf>,
}

/// Reads the state file, if configured. A corrupt snapshot is reported and will be
/// replaced by the next save; a file that is not a snapshot at all (a typo in
/// `state.file` naming some other file) is reported and never overwritten.
pub fn open(file: Option<&Path>, limits: Limits, clock: Clock) -> Opened {
    let mut save_to = file.map(Path::to_path_buf);
    let loaded = match file.map(|path| (path, snapshot::read(path))) {
        None | Some((_, Ok(None))) => None,
        Some((_, Ok(Some(snapshot)))) => Some(snapshot),
        Some((path, Err(error))) => {
            tracing::warn!(
                "ignoring the state file {}: {error}; starting with an empty affinity table",
                path.display()
            );
            if matches!(error, SnapshotError::Foreign) {
                tracing::error!(
                    "{} is not a state file: it will not be overwritten, and the table \
                     will not be saved until state.file names another path",
                    path.display()
                );
                save_to = None;
            }
            None
        }
    };
    let table = match &loaded {
        Some(snapshot) => AffinityTable::with_secret(snapshot.secret, limits, clock),
        None => AffinityTable::new(limits, clock),
    };
    Opened {
        table,
        snapshot: loaded,
        save_to,
    }
}

/// Puts a snapshot's sessions back into the gateway's table; returns how many.
pub fn restore(gateway: &Gateway, snapshot: Snapshot) -> usize {
    let settings = gateway.settings();
    let ids: Vec<Option<usize>> = snapshot
        .nodes
        .iter()
        .map(|name| settings.upstreams.by_name(name).map(|n| n.id))
        .collect();
    let total = snapshot.entries.len();
    let restored = gateway.table().restore(snapshot.entries, |index| {
        ids.get(usize::from(index)).copied().flatten()
    });
    tracing::info!(
        restored,
        left_out = total - restored,
        "affinity table restored from the state file"
    );
    restored
}

/// One save at a time: a periodic save still running at shutdown must not rename
/// its older snapshot over the final one.
static SAVING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Writes the table to `path` (atomically); returns how many sessions it holds.
pub fn save(gateway: &Gateway, path: &Path) -> std::io::Result<usize> {
    let _one_at_a_time = SAVING.lock().unwrap_or_else(|p| p.into_inner());
    let settings = gateway.settings();
    let nodes: Vec<String> = settings
        .upstreams
        .nodes()
        .iter()
        .map(|n| n.name.clone())
        .collect();
    let index = |id: usize| {
        let position = settings.upstreams.nodes().iter().position(|n| n.id == id)?;
        u16::try_from(position).ok()
    };
    let table = gateway.table();
    let saved_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    snapshot::write(path, &table.secret(), saved_at, &nodes, table.export(index))
}

/// Saves on a blocking thread (a million sessions take a moment to write), logging
/// the outcome.
pub async fn save_in_background(gateway: Arc<Gateway>, path: PathBuf) {
    let written = tokio::task::spawn_blocking(move || (save(&gateway, &path), path)).await;
    match written {
        Ok((Ok(count), path)) => {
            tracing::debug!(sessions = count, "state saved to {}", path.display());
        }
        Ok((Err(error), path)) => {
            tracing::warn!("cannot write the state file {}: {error}", path.display());
        }
        Err(error) => tracing::warn!("state save did not finish: {error}"),
    }
}

/// Saves every `every` until `stop` fires.
pub async fn run(
    gateway: Arc<Gateway>,
    path: PathBuf,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => save_in_background(gateway.clone(), path.clone()).await,
            _ = stop.changed() => return,
        }
    }
}

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
use std::time::{SystemTime, UNIX_EPOCH};

use crate::node_id::NodeId;
use crate::sessions::affinity::{AffinityTable, Limits};
use crate::sessions::clock::Clock;
use crate::sessions::snapshot::{self, Snapshot, SnapshotError};
pub use crate::sessions::snapshot::{SavedState, SnapshotNode};

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
    /// A snapshot keyed under another secret than the shared store's (the table of
    /// a gateway that just moved to `[store] kind = "redis"`): its (still empty)
    /// table, into which the snapshot is restored instead, so each session can move
    /// to the shared table at its student's next request.
    pub legacy: Option<AffinityTable>,
}

/// Reads the state file, if configured. A corrupt snapshot is reported and will be
/// replaced by the next save; a file that is not a snapshot at all (a typo in
/// `state.file` naming some other file) is reported and never overwritten.
///
/// `shared_secret` is the key secret every gateway of a shared store derives: the
/// table must use it. A snapshot made under another secret (before the store was
/// configured, or with another `store.secret`) cannot be merged into it, since
/// keys are hashes of ids the snapshot does not hold: it gets a legacy table of
/// its own, read by raw id at each request.
pub fn open(
    file: Option<&Path>,
    limits: Limits,
    clock: Clock,
    shared_secret: Option<[u8; 16]>,
) -> Opened {
    let mut save_to = file.map(Path::to_path_buf);
    let loaded = match file.map(|path| (path, snapshot::read(path))) {
        None => None,
        Some((path, Ok(None))) => {
            tracing::info!(
                "no state file at {} yet (normal at first start): the affinity table starts \
                 empty and is saved there from now on",
                path.display()
            );
            None
        }
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
    let legacy = match (&loaded, shared_secret) {
        (Some(snapshot), Some(secret)) if snapshot.secret != secret => {
            tracing::info!(
                "the state file's sessions were keyed without this store.secret: they move to \
                 the shared table one by one, at each student's next request"
            );
            Some(AffinityTable::with_secret(
                snapshot.secret,
                limits,
                clock.clone(),
            ))
        }
        _ => None,
    };
    let table = match (&loaded, shared_secret) {
        (_, Some(secret)) => AffinityTable::with_secret(secret, limits, clock),
        (Some(snapshot), None) => AffinityTable::with_secret(snapshot.secret, limits, clock),
        (None, None) => AffinityTable::new(limits, clock),
    };
    Opened {
        table,
        snapshot: loaded,
        save_to,
        legacy,
    }
}

/// Puts a snapshot's sessions back into `table`, each on the node that `node_id`
/// finds for its name now; returns how many. Sessions of a node no longer configured
/// are left out, to be dealt afresh.
pub fn restore(
    table: &AffinityTable,
    snapshot: Snapshot,
    node_id: impl Fn(&str) -> Option<NodeId>,
) -> usize {
    let ids: Vec<Option<NodeId>> = (snapshot.nodes.iter())
        .map(|node| node_id(&node.name))
        .collect();
    let total = snapshot.entries.len();
    let restored = table.restore(snapshot.entries, |index| {
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

/// Writes `table` to `path` (atomically), naming the `nodes` of the running config
/// (id, and name with admin state, in config order); returns how many sessions it
/// holds.
pub fn save(
    table: &AffinityTable,
    nodes: &[(NodeId, SnapshotNode)],
    path: &Path,
) -> std::io::Result<usize> {
    let _one_at_a_time = SAVING.lock().unwrap_or_else(|p| p.into_inner());
    let named: Vec<SnapshotNode> = nodes.iter().map(|(_, node)| node.clone()).collect();
    let index = |id: NodeId| {
        let position = nodes.iter().position(|(node, _)| *node == id)?;
        u16::try_from(position).ok()
    };
    let saved_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    snapshot::write(path, &table.secret(), saved_at, &named, table.export(index))
}

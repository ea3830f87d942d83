//! The affinity table's snapshot file: the bytes on disk, and nothing about the table.
//!
//! Why it looks like this:
//! - **Pure.** This module knows a file format, not the table: the table turns its
//!   entries into [`SnapshotEntry`] values and back, so either side can change alone.
//! - **It carries the key secret.** Keys are SipHash-1-3 of session ids under the
//!   table's secret; a table that loads the entries must adopt that secret too, or
//!   every key is noise. So the file is as sensitive as the table: it is created
//!   `0600`, and [`Snapshot`]'s `Debug` hides the secret. It never holds a raw id.
//! - **Atomic.** Written beside the target under a temporary name, fsync'd, renamed
//!   over it, then the directory fsync'd: after a crash at any moment the path holds
//!   the old snapshot or the new one, never a mix, and a reader never sees half a file.
//! - **Streaming.** The writer takes an iterator and holds one record at a time, so a
//!   million sessions need no second copy. Hence the entry count sits in a trailer,
//!   not the header: writing stays one forward pass (no seek back, and the checksum
//!   covers the bytes in file order), and the reader finds the entries from the file's
//!   size, which it needs anyway to bound what it allocates. An end marker before the
//!   count tells a truncated file from a damaged one.
//! - **A distrustful reader.** A file may be truncated, damaged, foreign or from
//!   another version: each is a [`SnapshotError`], never a panic. Lengths are checked
//!   against the file's size before anything is allocated. The checksum catches
//!   damage; it is not a MAC (whoever can write the file can read the secret in it).
//!   Damage is reported before implausible contents, since it is the likelier cause.
//!
//! - **It carries the admins' word on each node.** A drain or a disable is what an
//!   admin decided, and a gateway on its own has nowhere else to keep it: each node
//!   of the table is written with its admin state and the state the config file
//!   gave it then, so a restart can tell an admin's change (kept) from a change
//!   the file made since (which wins).
//!
//! Layout, integers little-endian:
//! ```text
//! header   "MGWSNAP\0" · u32 version (2, or 1) · [u8; 16] secret · u64 saved_at
//! nodes    u16 count · count × (u8 length · UTF-8 name · u8 state · u8 configured)
//! entries  n × 32 bytes: u64 key · u64 created · u64 last_seen · u32 requests ·
//!          u16 node · u16 flags (bit 0: logged in; the others are zero)
//! trailer  "MGWSEND\0" · u64 n · u64 SipHash-1-3 checksum of every byte before it
//! ```
//! A state byte is 0 active, 1 draining, 2 disabled, 0xff not recorded. Version 1
//! files (no state bytes) are still read: their nodes carry no state. And a snapshot
//! with no admin change to keep (every node as its file says) is written as version
//! 1, so a gateway rolled back to a build that knows only version 1 keeps its table.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::hash::Hasher;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip::SipHasher13;

use crate::config::NodeState;

const MAGIC: [u8; 8] = *b"MGWSNAP\0";
const END: [u8; 8] = *b"MGWSEND\0";
const VERSION: u32 = 2;
/// The format before node states were kept; still read.
const VERSION_1: u32 = 1;
/// A state byte for a node whose state is not recorded.
const NO_STATE: u8 = 0xff;
const RECORD: usize = 32;
const TRAILER: u64 = 24;
const LOGGED_IN: u16 = 1;
/// A node name's length is one byte.
const MAX_NAME: usize = u8::MAX as usize;
/// Fixed for ever since version 1: the checksum detects accidents, it guards no secret.
const CHECKSUM_KEYS: (u64, u64) = (0x6d67_772d_736e_6170, 0x6368_6563_6b73_756d);
/// Large reads and writes: a million entries are 32 MiB.
const BUFFER: usize = 64 * 1024;

/// One session as the file holds it: plain values, detached from the live table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// The table key: the keyed hash of the session id under [`Snapshot::secret`].
    pub key: u64,
    /// An index into [`Snapshot::nodes`], not a position in the config: names survive
    /// a reordered or edited node list, indices would silently point elsewhere.
    pub node: u16,
    /// Whether a login issued the session; idle limits differ by state.
    pub logged_in: bool,
    /// When the session was bound, Unix seconds: a restart resets the table's
    /// monotonic clock, the wall clock carries on.
    pub created: u64,
    /// When a request last used it, Unix seconds. It may be earlier than `created`:
    /// the wall clock can step back between the two, so the reader does not object.
    pub last_seen: u64,
    /// Requests routed by it, for the admin view.
    pub requests: u32,
}

/// A node as a snapshot names it, with the admin state it had when written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotNode {
    /// The configured name (entries refer to the node by its index in the table).
    pub name: String,
    /// `None` when not recorded (a version 1 file).
    pub state: Option<SavedState>,
}

/// A node's admin state at the moment of the snapshot, and the config file's word on
/// it then: an admin changed it where the two differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedState {
    /// What the node was: active, draining or disabled.
    pub now: NodeState,
    /// What the config file's `state` said.
    pub configured: NodeState,
}

/// A whole snapshot as read back.
#[derive(Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The secret the keys were hashed under; the loading table must adopt it.
    pub secret: [u8; 16],
    /// When it was written, Unix seconds: the downtime counts as idle time.
    pub saved_at: u64,
    /// The nodes the entries' indices refer to.
    pub nodes: Vec<SnapshotNode>,
    /// The sessions, in the order written.
    pub entries: Vec<SnapshotEntry>,
}

/// By hand, so that the key secret never reaches a log.
impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("secret", &"<redacted>")
            .field("saved_at", &self.saved_at)
            .field("nodes", &self.nodes)
            .field("entries", &self.entries.len())
            .finish()
    }
}

/// Why a snapshot file cannot be used. Each calls for a different reaction from the
/// operator, so each is its own variant; the gateway then starts with an empty table.
#[derive(Debug)]
pub enum SnapshotError {
    /// The file exists but could not be read (permissions, I/O error).
    Io(io::Error),
    /// Not a moodle-gateway snapshot: the magic bytes are wrong. The path is likely
    /// misconfigured; the file is someone else's and must not be overwritten blindly.
    Foreign,
    /// Written by a version of the gateway with an incompatible format.
    Version(u32),
    /// A snapshot, but damaged or impossible; says why.
    Corrupt(String),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(error) => write!(f, "cannot read the snapshot: {error}"),
            Self::Foreign => f.write_str("not a moodle-gateway snapshot"),
            Self::Version(v) => write!(
                f,
                "written by an incompatible version: format {v}, this build reads formats \
                 {VERSION_1} and {VERSION}"
            ),
            Self::Corrupt(why) => write!(f, "corrupt: {why}"),
        }
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(error) => Some(error),
            _ => None,
        }
    }
}

impl From<io::Error> for SnapshotError {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

/// Writes atomically: a temp file in the same directory (unique name: pid and a
/// counter, so a periodic and a shutdown snapshot never share one), written through a
/// BufWriter, fsync'd, permissions 0600 (it holds the key secret), renamed over `path`,
/// then the directory fsync'd. On any error the temp file is removed and `path` is
/// untouched, except when the final directory fsync fails: the new snapshot is then
/// in place but may not survive a power loss, and the error says so. Returns the
/// number of entries written. Names over 255 bytes, more than 65535 nodes or an entry
/// naming a node that is not in `nodes` are `InvalidInput`: a file the reader would
/// refuse is never written.
pub fn write(
    path: &Path,
    secret: &[u8; 16],
    saved_at: u64,
    nodes: &[SnapshotNode],
    entries: impl IntoIterator<Item = SnapshotEntry>,
) -> io::Result<usize> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    // With no admin change to keep, the file is the version before node states were
    // kept: a gateway rolled back to that version still reads it and keeps every
    // student on their node.
    let changed = (nodes.iter()).any(|n| n.state.is_some_and(|s| s.now != s.configured));
    let version = if changed { VERSION } else { VERSION_1 };
    let table = node_table(nodes, version)?;
    let name = path.file_name().ok_or_else(|| invalid("no file name"))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let temp = dir.join(format!(
        ".{}.{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let head = Head {
        version,
        secret,
        saved_at,
    };
    let written = write_temp(&temp, &head, &table, nodes.len(), entries)
        .and_then(|count| fs::rename(&temp, path).map(|()| count));
    match written {
        Ok(count) => sync_dir(dir).map(|()| count),
        Err(error) => {
            let _ = fs::remove_file(&temp);
            Err(error)
        }
    }
}

/// The encoded node table, or why these names cannot be written.
fn node_table(nodes: &[SnapshotNode], version: u32) -> io::Result<Vec<u8>> {
    let count = u16::try_from(nodes.len())
        .map_err(|_| invalid(format!("{} nodes, at most {} fit", nodes.len(), u16::MAX)))?;
    let mut table = count.to_le_bytes().to_vec();
    for SnapshotNode { name, state } in nodes {
        let len = u8::try_from(name.len())
            .map_err(|_| invalid(format!("node name {name:?} is over {MAX_NAME} bytes")))?;
        table.push(len);
        table.extend_from_slice(name.as_bytes());
        if version != VERSION_1 {
            table.extend_from_slice(&match state {
                Some(s) => [state_byte(s.now), state_byte(s.configured)],
                None => [NO_STATE; 2],
            });
        }
    }
    Ok(table)
}

fn state_byte(state: NodeState) -> u8 {
    match state {
        NodeState::Active => 0,
        NodeState::Draining => 1,
        NodeState::Disabled => 2,
    }
}

/// The state a byte stands for; `Err` for a byte no writer writes.
fn byte_state(byte: u8) -> Result<Option<NodeState>, u8> {
    match byte {
        0 => Ok(Some(NodeState::Active)),
        1 => Ok(Some(NodeState::Draining)),
        2 => Ok(Some(NodeState::Disabled)),
        NO_STATE => Ok(None),
        other => Err(other),
    }
}

/// The writer's side: everything put is also checksummed.
struct Output {
    file: BufWriter<File>,
    hasher: SipHasher13,
}

impl Output {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hasher.write(bytes);
        self.file.write_all(bytes)
    }
}

/// What the header holds.
struct Head<'a> {
    version: u32,
    secret: &'a [u8; 16],
    saved_at: u64,
}

/// Writes the whole file at `temp` and syncs it; returns the number of entries.
fn write_temp(
    temp: &Path,
    head: &Head<'_>,
    node_table: &[u8],
    nodes: usize,
    entries: impl IntoIterator<Item = SnapshotEntry>,
) -> io::Result<usize> {
    let file = BufWriter::with_capacity(BUFFER, create_private(temp)?);
    let mut out = Output {
        file,
        hasher: checksummer(),
    };
    for part in [
        &MAGIC[..],
        &head.version.to_le_bytes(),
        head.secret,
        &head.saved_at.to_le_bytes(),
        node_table,
    ] {
        out.put(part)?;
    }
    let mut count = 0;
    for entry in entries {
        if usize::from(entry.node) >= nodes {
            let why = format!("an entry names node {} of {nodes}", entry.node);
            return Err(invalid(why));
        }
        out.put(&entry.encode())?;
        count += 1;
    }
    out.put(&END)?;
    out.put(&(count as u64).to_le_bytes())?;
    let checksum = out.hasher.finish();
    out.file.write_all(&checksum.to_le_bytes())?;
    out.file
        .into_inner()
        .map_err(io::IntoInnerError::into_error)?
        .sync_all()?;
    Ok(count)
}

/// A new file only the owner can read: never an existing one, nor a planted symlink.
fn create_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let file = options.mode(0o600).open(path)?;
        // Exactly 0600, whatever the umask took away.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        Ok(file)
    }
    #[cfg(not(unix))]
    options.open(path)
}

/// Makes the rename itself durable: without it, a power loss can bring back the old name.
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all().map_err(|error| {
            let why = format!("the new snapshot is in place but may not be durable: {error}");
            io::Error::new(error.kind(), why)
        })
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Ok(None) when the file does not exist; otherwise the whole snapshot or why it cannot be used.
pub fn read(path: &Path) -> Result<Option<Snapshot>, SnapshotError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let left = file.metadata()?.len();
    let file = BufReader::with_capacity(BUFFER, file);
    let mut input = Input {
        file,
        hasher: checksummer(),
        left,
    };
    let (version, secret, saved_at) = read_header(&mut input)?;
    // Implausible contents are noted here and reported only once the checksum held.
    let mut problem = None;
    let nodes = read_nodes(&mut input, version, &mut problem)?;
    let entries = read_entries(&mut input, nodes.len(), &mut problem)?;
    check_trailer(&mut input, entries.len())?;
    match problem {
        Some(why) => Err(SnapshotError::Corrupt(why)),
        None => Ok(Some(Snapshot {
            secret,
            saved_at,
            nodes,
            entries,
        })),
    }
}

/// The reader's side: knows how much of the file is left and checksums what it reads.
struct Input {
    file: BufReader<File>,
    hasher: SipHasher13,
    left: u64,
}

impl Input {
    fn take<const N: usize>(&mut self, part: &str) -> Result<[u8; N], SnapshotError> {
        let mut bytes = [0; N];
        self.fill(&mut bytes, part)?;
        Ok(bytes)
    }

    /// Fills `buf`, checking first that the file holds that much.
    fn fill(&mut self, buf: &mut [u8], part: &str) -> Result<(), SnapshotError> {
        if self.left < buf.len() as u64 {
            return Err(corrupt(format!("truncated in the {part}")));
        }
        self.file.read_exact(buf)?;
        self.hasher.write(buf);
        self.left -= buf.len() as u64;
        Ok(())
    }
}

fn read_header(input: &mut Input) -> Result<(u32, [u8; 16], u64), SnapshotError> {
    if input.left == 0 {
        // Likelier a snapshot whose data never reached the disk than someone else's file.
        return Err(corrupt("the file is empty"));
    }
    let mut magic = [0; 8];
    let magic = &mut magic[..usize::try_from(input.left).unwrap_or(8).min(8)];
    input.fill(magic, "header")?;
    if *magic != MAGIC[..magic.len()] {
        return Err(SnapshotError::Foreign);
    }
    let version = u32::from_le_bytes(input.take("header")?);
    if version != VERSION && version != VERSION_1 {
        return Err(SnapshotError::Version(version));
    }
    let secret = input.take("header")?;
    let saved_at = u64::from_le_bytes(input.take("header")?);
    Ok((version, secret, saved_at))
}

fn read_nodes(
    input: &mut Input,
    version: u32,
    problem: &mut Option<String>,
) -> Result<Vec<SnapshotNode>, SnapshotError> {
    let count = u16::from_le_bytes(input.take("node table")?);
    if u64::from(count) > input.left {
        return Err(corrupt("truncated in the node table"));
    }
    let mut nodes = Vec::with_capacity(usize::from(count));
    for index in 0..count {
        let [len] = input.take("node table")?;
        let mut buf = [0; MAX_NAME];
        let name = &mut buf[..usize::from(len)];
        input.fill(name, "node table")?;
        let name = String::from_utf8(name.to_vec()).unwrap_or_else(|_| {
            problem.get_or_insert_with(|| format!("node {index}'s name is not UTF-8"));
            String::new()
        });
        let state = match version {
            VERSION_1 => None,
            _ => {
                let bytes: [u8; 2] = input.take("node table")?;
                match (byte_state(bytes[0]), byte_state(bytes[1])) {
                    (Ok(Some(now)), Ok(Some(configured))) => Some(SavedState { now, configured }),
                    (Ok(None), Ok(None)) => None,
                    _ => {
                        problem.get_or_insert_with(|| {
                            format!("node {index} has unknown state bytes {bytes:02x?}")
                        });
                        None
                    }
                }
            }
        };
        nodes.push(SnapshotNode { name, state });
    }
    Ok(nodes)
}

/// The entries fill the file up to the trailer: their number follows from its size.
fn read_entries(
    input: &mut Input,
    nodes: usize,
    problem: &mut Option<String>,
) -> Result<Vec<SnapshotEntry>, SnapshotError> {
    let record = RECORD as u64;
    let count = match input.left.checked_sub(TRAILER) {
        Some(body) if body % record == 0 => body / record,
        _ => return Err(truncated_after(input.left / record)),
    };
    let count = usize::try_from(count).map_err(|_| corrupt("too large for this machine"))?;
    let mut entries = Vec::with_capacity(count);
    for index in 0..count {
        let (entry, flags) = SnapshotEntry::decode(&input.take("entries")?);
        if usize::from(entry.node) >= nodes {
            problem.get_or_insert_with(|| {
                format!("entry {index} names node {} of {nodes}", entry.node)
            });
        }
        if flags & !LOGGED_IN != 0 {
            problem.get_or_insert_with(|| format!("entry {index} has unknown flags {flags:#x}"));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// End marker first (a cut file), then checksum (damage), then the count.
fn check_trailer(input: &mut Input, entries: usize) -> Result<(), SnapshotError> {
    let end: [u8; 8] = input.take("trailer")?;
    let count = u64::from_le_bytes(input.take("trailer")?);
    let computed = input.hasher.finish();
    let stored = u64::from_le_bytes(input.take("trailer")?);
    if end != END {
        return Err(truncated_after(entries as u64));
    }
    if stored != computed {
        return Err(corrupt("checksum mismatch"));
    }
    if count != entries as u64 {
        let why = format!("the trailer counts {count} entries, the file holds {entries}");
        return Err(corrupt(why));
    }
    Ok(())
}

impl SnapshotEntry {
    fn encode(&self) -> [u8; RECORD] {
        let flags = if self.logged_in { LOGGED_IN } else { 0 };
        let mut record = [0; RECORD];
        record[0..8].copy_from_slice(&self.key.to_le_bytes());
        record[8..16].copy_from_slice(&self.created.to_le_bytes());
        record[16..24].copy_from_slice(&self.last_seen.to_le_bytes());
        record[24..28].copy_from_slice(&self.requests.to_le_bytes());
        record[28..30].copy_from_slice(&self.node.to_le_bytes());
        record[30..32].copy_from_slice(&flags.to_le_bytes());
        record
    }

    /// The entry and its raw flags, which the caller checks.
    fn decode(record: &[u8; RECORD]) -> (Self, u16) {
        let bytes = |at: usize| -> [u8; 8] { std::array::from_fn(|i| record[at + i]) };
        let flags = u16::from_le_bytes([record[30], record[31]]);
        let entry = Self {
            key: u64::from_le_bytes(bytes(0)),
            created: u64::from_le_bytes(bytes(8)),
            last_seen: u64::from_le_bytes(bytes(16)),
            requests: u32::from_le_bytes([record[24], record[25], record[26], record[27]]),
            node: u16::from_le_bytes([record[28], record[29]]),
            logged_in: flags & LOGGED_IN != 0,
        };
        (entry, flags)
    }
}

fn checksummer() -> SipHasher13 {
    SipHasher13::new_with_keys(CHECKSUM_KEYS.0, CHECKSUM_KEYS.1)
}

fn truncated_after(entries: u64) -> SnapshotError {
    corrupt(format!(
        "truncated after {entries} entries: the end marker is missing"
    ))
}

fn corrupt(why: impl Into<String>) -> SnapshotError {
    SnapshotError::Corrupt(why.into())
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const SECRET: [u8; 16] = *b"0123456789abcdef";
    const SAVED_AT: u64 = 1_760_000_000;

    /// A fresh directory under the system temp dir, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(test: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "moodle-gateway-snapshot-{}-{test}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn file(&self) -> PathBuf {
            self.0.join("affinity.state")
        }

        fn names(&self) -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn nodes() -> Vec<SnapshotNode> {
        let node = |name: &str, now, configured| SnapshotNode {
            name: name.into(),
            state: Some(SavedState { now, configured }),
        };
        vec![
            node("php1", NodeState::Active, NodeState::Active),
            node("php2", NodeState::Draining, NodeState::Active),
            node("ρ3", NodeState::Disabled, NodeState::Draining),
        ]
    }

    fn entries(n: usize) -> impl Iterator<Item = SnapshotEntry> {
        (0..n as u64).map(|i| SnapshotEntry {
            key: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            node: (i % 3) as u16,
            logged_in: i % 2 == 0,
            created: SAVED_AT - 3600 + i,
            last_seen: SAVED_AT - i,
            requests: i as u32,
        })
    }

    /// Writes `n` entries and returns the file's bytes.
    fn written(scratch: &Scratch, n: usize) -> Vec<u8> {
        let count = write(&scratch.file(), &SECRET, SAVED_AT, &nodes(), entries(n)).unwrap();
        assert_eq!(count, n);
        fs::read(scratch.file()).unwrap()
    }

    /// Reads `bytes` as a snapshot file.
    fn read_bytes(scratch: &Scratch, bytes: &[u8]) -> Result<Option<Snapshot>, SnapshotError> {
        let path = scratch.0.join("edited.state");
        fs::write(&path, bytes).unwrap();
        read(&path)
    }

    /// What a correct writer would have sealed: damage that the checksum cannot see.
    fn reseal(bytes: &mut [u8]) {
        let at = bytes.len() - 8;
        let mut hasher = checksummer();
        hasher.write(&bytes[..at]);
        bytes[at..].copy_from_slice(&hasher.finish().to_le_bytes());
    }

    fn corrupt_why(result: Result<Option<Snapshot>, SnapshotError>) -> String {
        match result {
            Err(SnapshotError::Corrupt(why)) => why,
            other => panic!("expected corrupt, got {other:?}"),
        }
    }

    /// Where the entries start in files written with [`nodes`].
    fn entries_start() -> usize {
        8 + 4 + 16 + 8 + node_table(&nodes(), VERSION).unwrap().len()
    }

    #[test]
    fn what_is_written_reads_back_unchanged() {
        let scratch = Scratch::new("round-trip");
        for n in [0, 5, 100_000] {
            written(&scratch, n);
            let snapshot = read(&scratch.file()).unwrap().unwrap();
            assert_eq!(snapshot.secret, SECRET);
            assert_eq!(snapshot.saved_at, SAVED_AT);
            assert_eq!(snapshot.nodes, nodes());
            assert_eq!(snapshot.entries, entries(n).collect::<Vec<_>>());
        }
    }

    /// Nothing an admin changed: the file is version 1, which an older build reads.
    #[test]
    fn a_snapshot_with_no_admin_change_is_written_as_version_1() {
        let scratch = Scratch::new("plain");
        let plain: Vec<SnapshotNode> = (nodes().into_iter())
            .map(|n| SnapshotNode {
                state: n.state.map(|s| SavedState {
                    now: s.configured,
                    ..s
                }),
                ..n
            })
            .collect();
        write(&scratch.file(), &SECRET, SAVED_AT, &plain, entries(3)).unwrap();
        let bytes = fs::read(scratch.file()).unwrap();
        assert_eq!(bytes[8..12], VERSION_1.to_le_bytes());
        let snapshot = read(&scratch.file()).unwrap().unwrap();
        assert!(snapshot.nodes.iter().all(|n| n.state.is_none()));
        assert_eq!(snapshot.entries, entries(3).collect::<Vec<_>>());
    }

    /// A gateway upgraded from a version that kept no node states keeps its sessions:
    /// the file's nodes come back without a state, and the config file's apply.
    #[test]
    fn a_version_1_file_reads_with_no_node_states() {
        let scratch = Scratch::new("version-1");
        let v2 = written(&scratch, 5);
        let mut v1 = v2[..8].to_vec();
        v1.extend_from_slice(&VERSION_1.to_le_bytes());
        let mut at = 12 + 16 + 8;
        v1.extend_from_slice(&v2[12..at + 2]);
        at += 2;
        for _ in nodes() {
            let len = usize::from(v2[at]);
            v1.extend_from_slice(&v2[at..at + 1 + len]);
            at += 1 + len + 2;
        }
        v1.extend_from_slice(&v2[at..]);
        reseal(&mut v1);
        let snapshot = read_bytes(&scratch, &v1).unwrap().unwrap();
        let names: Vec<_> = snapshot.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["php1", "php2", "ρ3"]);
        assert!(snapshot.nodes.iter().all(|n| n.state.is_none()));
        assert_eq!(snapshot.entries, entries(5).collect::<Vec<_>>());
    }

    #[test]
    fn a_clock_that_stepped_back_is_not_corruption() {
        let scratch = Scratch::new("clock");
        let entry = SnapshotEntry {
            created: 2000,
            last_seen: 1000,
            ..entries(1).next().unwrap()
        };
        write(&scratch.file(), &SECRET, SAVED_AT, &nodes(), [entry]).unwrap();
        assert_eq!(read(&scratch.file()).unwrap().unwrap().entries, [entry]);
    }

    #[test]
    fn a_missing_file_is_no_snapshot_rather_than_an_error() {
        let scratch = Scratch::new("missing");
        assert_eq!(read(&scratch.file()).unwrap(), None);
    }

    #[test]
    fn someone_elses_file_is_foreign() {
        let scratch = Scratch::new("foreign");
        let text = b"[listen]\npublic = \"0.0.0.0:80\"\n";
        assert!(matches!(
            read_bytes(&scratch, text),
            Err(SnapshotError::Foreign)
        ));
        assert!(matches!(
            read_bytes(&scratch, b"MGW"),
            Err(SnapshotError::Corrupt(_))
        ));
        assert!(matches!(
            read_bytes(&scratch, b"MGX"),
            Err(SnapshotError::Foreign)
        ));
    }

    #[test]
    fn another_format_version_is_refused_by_number() {
        let scratch = Scratch::new("version");
        let mut bytes = written(&scratch, 3);
        bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
        reseal(&mut bytes);
        assert!(matches!(
            read_bytes(&scratch, &bytes),
            Err(SnapshotError::Version(3))
        ));
    }

    #[test]
    fn a_file_cut_anywhere_is_corrupt() {
        let scratch = Scratch::new("truncated");
        let bytes = written(&scratch, 4);
        for len in 0..bytes.len() {
            let why = corrupt_why(read_bytes(&scratch, &bytes[..len]));
            assert!(
                why.contains("truncated") || why == "the file is empty",
                "{len}: {why}"
            );
        }
        let bytes = written(&scratch, 5000);
        let cut = entries_start() + 1234 * RECORD + 7;
        let why = corrupt_why(read_bytes(&scratch, &bytes[..cut]));
        assert_eq!(
            why,
            "truncated after 1234 entries: the end marker is missing"
        );
        let cut = entries_start() + 1234 * RECORD + TRAILER as usize;
        let why = corrupt_why(read_bytes(&scratch, &bytes[..cut]));
        assert_eq!(
            why,
            "truncated after 1234 entries: the end marker is missing"
        );
    }

    #[test]
    fn any_flipped_byte_is_caught() {
        let scratch = Scratch::new("flipped");
        let bytes = written(&scratch, 4);
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            match (at, read_bytes(&scratch, &damaged)) {
                (0..8, Err(SnapshotError::Foreign)) | (8..12, Err(SnapshotError::Version(_))) => {}
                (12.., Err(SnapshotError::Corrupt(_))) => {}
                (_, other) => panic!("byte {at}: {other:?}"),
            }
        }
        let mut damaged = bytes.clone();
        damaged[entries_start() + 40] ^= 1;
        assert_eq!(
            corrupt_why(read_bytes(&scratch, &damaged)),
            "checksum mismatch"
        );
    }

    #[test]
    fn well_sealed_but_impossible_contents_are_corrupt() {
        let scratch = Scratch::new("impossible");
        let bytes = written(&scratch, 4);
        let second = entries_start() + RECORD;
        let cases: [(usize, &[u8], &str); 4] = [
            (second + 28, &[3, 0], "entry 1 names node 3 of 3"),
            (second + 30, &[2, 0], "entry 1 has unknown flags 0x2"),
            (
                8 + 4 + 16 + 8 + 2 + 1,
                &[0xff],
                "node 0's name is not UTF-8",
            ),
            (
                8 + 4 + 16 + 8 + 2 + 1 + 4,
                &[7],
                "node 0 has unknown state bytes [07, 00]",
            ),
        ];
        for (at, patch, expected) in cases {
            let mut edited = bytes.clone();
            edited[at..at + patch.len()].copy_from_slice(patch);
            reseal(&mut edited);
            assert_eq!(corrupt_why(read_bytes(&scratch, &edited)), expected);
        }
        let mut edited = bytes.clone();
        let count_at = bytes.len() - 16;
        edited[count_at..count_at + 8].copy_from_slice(&9u64.to_le_bytes());
        reseal(&mut edited);
        let why = corrupt_why(read_bytes(&scratch, &edited));
        assert_eq!(why, "the trailer counts 9 entries, the file holds 4");
    }

    #[test]
    fn writing_over_a_snapshot_replaces_it_and_leaves_no_temp_files() {
        let scratch = Scratch::new("replace");
        written(&scratch, 10);
        written(&scratch, 3);
        assert_eq!(read(&scratch.file()).unwrap().unwrap().entries.len(), 3);
        assert_eq!(scratch.names(), ["affinity.state"]);
    }

    #[test]
    fn a_failed_write_leaves_the_old_snapshot_and_no_temp_files() {
        let scratch = Scratch::new("failed");
        let old = written(&scratch, 10);
        let missing = scratch.0.join("no-such-dir").join("affinity.state");
        assert!(write(&missing, &SECRET, SAVED_AT, &nodes(), entries(3)).is_err());
        let stray = entries(3).chain([SnapshotEntry {
            node: 7,
            ..entries(1).next().unwrap()
        }]);
        let error = write(&scratch.file(), &SECRET, SAVED_AT, &nodes(), stray).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        let long = [SnapshotNode {
            name: "x".repeat(256),
            state: None,
        }];
        assert!(write(&scratch.file(), &SECRET, SAVED_AT, &long, entries(0)).is_err());
        // The rename fails: the target is a directory.
        fs::create_dir(scratch.0.join("taken")).unwrap();
        assert!(write(
            &scratch.0.join("taken"),
            &SECRET,
            SAVED_AT,
            &nodes(),
            entries(3)
        )
        .is_err());
        assert_eq!(fs::read(scratch.file()).unwrap(), old);
        assert_eq!(scratch.names(), ["affinity.state", "taken"]);
    }

    #[cfg(unix)]
    #[test]
    fn only_the_owner_can_read_the_secret() {
        use std::os::unix::fs::PermissionsExt;
        let scratch = Scratch::new("private");
        fs::write(scratch.file(), b"old").unwrap();
        fs::set_permissions(scratch.file(), fs::Permissions::from_mode(0o644)).unwrap();
        written(&scratch, 1);
        let mode = fs::metadata(scratch.file()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn errors_tell_the_operator_what_happened_and_debug_hides_the_secret() {
        assert_eq!(
            SnapshotError::Foreign.to_string(),
            "not a moodle-gateway snapshot"
        );
        assert_eq!(
            SnapshotError::Version(3).to_string(),
            "written by an incompatible version: format 3, this build reads formats 1 and 2"
        );
        assert_eq!(
            corrupt("checksum mismatch").to_string(),
            "corrupt: checksum mismatch"
        );
        let snapshot = Snapshot {
            secret: SECRET,
            saved_at: 0,
            nodes: nodes(),
            entries: vec![],
        };
        assert!(!format!("{snapshot:?}").contains("0123456789"));
    }
}

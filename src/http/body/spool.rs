//! Upload bodies kept on disk until they are whole (`limits.spool_body_bytes`),
//! so a student on a slow line never holds a PHP worker while an assignment
//! trickles in: the node sees the request only once every byte is here, and then
//! gets it at LAN speed. nginx's `proxy_request_buffering` does the same.
//!
//! Why files nobody can name: each one is opened `O_TMPFILE` (or created and
//! unlinked at once where the filesystem lacks it), so the data lives only as long
//! as its descriptor. A crash, a `kill -9` or a student who vanishes mid-upload
//! leaves nothing in `spool_dir` to clean up, and no other process can open it.
//!
//! Why a reservation: the disk the spool may use at once is bounded
//! (`limits.spool_max_bytes`). A body reserves its length (a chunked one the whole
//! `spool_body_bytes`, given back down to what it wrote once it ends) before its
//! first byte is written, and the [`Reservation`]'s `Drop` gives it back on every
//! path: sent, failed, abandoned, or the process shutting down. A body that finds
//! the spool full streams to its node as it arrives, as it did before the spool
//! existed: waiting would not help the student, and refusing would be worse.
//!
//! Every read and write runs on tokio's blocking pool, never on the async
//! workers, in chunks of [`CHUNK`]: a spooled gigabyte costs a few of them in
//! memory, never the whole body.

use std::fs::{DirBuilder, File, OpenOptions};
use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::task::JoinHandle;

use crate::http::body::BoxError;

/// A spool that cannot be used fails every upload of a deadline's crowd the same way
/// (a full disk, a directory gone): said once a minute, with the count held back.
static SPOOL_FAILED: crate::logs::Every =
    crate::logs::Every::new(std::time::Duration::from_secs(60));

/// What the spool reads and writes at a time: large enough that a LAN-speed send
/// is not a blocking-pool round trip per TCP segment, small enough to stay flat.
pub const CHUNK: usize = 64 * 1024;

/// The spool: its directory and the disk it may use. A cheap-clone handle; the
/// accounting is a few atomics, never a lock.
#[derive(Debug, Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    max_bytes: u64,
    /// Bytes reserved by bodies on disk now.
    used: AtomicU64,
    /// Bodies on disk now.
    bodies: AtomicU64,
    /// Bodies spooled since the start.
    spooled: AtomicU64,
    /// Bodies that found the spool full and streamed instead.
    full: AtomicU64,
}

/// The spool's figures, for `/metrics`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SpoolNow {
    /// Bodies on disk now.
    pub bodies: u64,
    /// Bytes they reserve.
    pub bytes: u64,
    /// Bodies spooled since the start.
    pub spooled: u64,
    /// Bodies that found the spool full and streamed to their node instead.
    pub full: u64,
}

impl Spool {
    /// The spool in `dir`, using at most `max_bytes` of disk at once. Nothing is
    /// touched on disk until [`prepare`](Self::prepare) or the first body.
    pub fn new(dir: PathBuf, max_bytes: u64) -> Self {
        let inner = Inner {
            dir,
            max_bytes,
            used: AtomicU64::new(0),
            bodies: AtomicU64::new(0),
            spooled: AtomicU64::new(0),
            full: AtomicU64::new(0),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Creates the directory (mode 0700) if missing and proves the gateway can
    /// write there, so a wrong path fails the start rather than every upload at a
    /// deadline. The directory must be the gateway user's own and closed to
    /// everyone else: students' files wait there.
    pub fn prepare(&self) -> Result<(), String> {
        let dir = self.dir();
        let shown = dir.display();
        let created = DirBuilder::new().recursive(true).mode(0o700).create(dir);
        created.map_err(|e| format!("cannot create {shown}: {e}"))?;
        let meta = std::fs::metadata(dir).map_err(|e| format!("cannot read {shown}: {e}"))?;
        if !meta.is_dir() {
            return Err(format!("{shown} is not a directory"));
        }
        let probe = unnamed(dir).map_err(|e| format!("cannot write in {shown}: {e}"))?;
        let mine = probe.metadata().map_err(|e| e.to_string())?.uid();
        if meta.uid() != mine {
            return Err(format!(
                "{shown} belongs to uid {}, not to the gateway's user (uid {mine})",
                meta.uid()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "{shown} is open to other users (mode {:o}): students' uploads wait there; chmod 700 it",
                meta.mode() & 0o7777
            ));
        }
        Ok(())
    }

    /// Reserves `bytes` of the spool's disk, or `None` (counted) when they do not
    /// fit beside the bodies already there.
    pub fn reserve(&self, bytes: u64) -> Option<Reservation> {
        let inner = &self.inner;
        let fits = |used: u64| used.checked_add(bytes).filter(|&n| n <= inner.max_bytes);
        if inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, fits)
            .is_err()
        {
            inner.full.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        inner.bodies.fetch_add(1, Ordering::Relaxed);
        inner.spooled.fetch_add(1, Ordering::Relaxed);
        Some(Reservation {
            spool: self.inner.clone(),
            bytes,
        })
    }

    /// The figures now.
    pub fn now(&self) -> SpoolNow {
        let inner = &self.inner;
        SpoolNow {
            bodies: inner.bodies.load(Ordering::Relaxed),
            bytes: inner.used.load(Ordering::Relaxed),
            spooled: inner.spooled.load(Ordering::Relaxed),
            full: inner.full.load(Ordering::Relaxed),
        }
    }
}

/// Disk reserved for one body, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    spool: Arc<Inner>,
    bytes: u64,
}

impl Reservation {
    /// Gives back what a body reserved beyond the `bytes` it wrote.
    fn shrink_to(&mut self, bytes: u64) {
        if let Some(excess) = self.bytes.checked_sub(bytes) {
            self.spool.used.fetch_sub(excess, Ordering::AcqRel);
            self.bytes = bytes;
        }
    }

    /// Opens the body's unnamed file; `None` (logged) when the disk refuses, and
    /// the body streams instead.
    pub async fn open(self) -> Option<SpoolFile> {
        let dir = self.spool.dir.clone();
        let opened = tokio::task::spawn_blocking(move || unnamed(&dir)).await;
        match opened.map_err(io::Error::other).and_then(|r| r) {
            Ok(file) => Some(SpoolFile {
                file: Arc::new(file),
                reservation: self,
            }),
            Err(error) => {
                let dir = self.spool.dir.display();
                if let Some(held_back) = SPOOL_FAILED.allow() {
                    tracing::warn!(held_back, "cannot spool an upload in limits.spool_dir {dir}: {error}; it streams to its node");
                }
                None
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.spool.used.fetch_sub(self.bytes, Ordering::AcqRel);
        self.spool.bodies.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A file in `dir` that has no name: `O_TMPFILE`, or where the filesystem lacks
/// it a fresh name unlinked at once (mode 0600 for the instant it exists).
fn unnamed(dir: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).mode(0o600);
    #[cfg(target_os = "linux")]
    {
        let mut tmpfile = options.clone();
        match tmpfile.custom_flags(libc::O_TMPFILE).open(dir) {
            Ok(file) => return Ok(file),
            // EOPNOTSUPP (and EISDIR from kernels that predate O_TMPFILE): this
            // filesystem cannot make unnamed files; anything else is real.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {}
            Err(e) => return Err(e),
        }
    }
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| io::Error::other(e.to_string()))?;
    let name: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!(".upload-{name}"));
    let file = options.create_new(true).open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

/// A body's file while it is being written.
#[derive(Debug)]
pub struct SpoolFile {
    file: Arc<File>,
    reservation: Reservation,
}

/// What [`SpoolFile::fill`] left: the file, what must follow it from memory, and
/// whether the body ended.
#[derive(Debug)]
pub struct Filled {
    /// The spooled bytes, sent first.
    pub spooled: Spooled,
    /// Bytes read but not on disk (the frame that would have passed the limit, or
    /// a chunk the disk refused), sent right after the file.
    pub after: Option<Bytes>,
    /// The body ended: nothing more is to come from the student.
    pub ended: bool,
}

impl SpoolFile {
    /// Writes `first`, then `body`'s frames, until the body ends or the next frame
    /// would take the file past `limit`. A body error (the student's) fails it; a
    /// disk error only stops the spooling, so the body streams on from there.
    /// Trailers are dropped: the body goes on with a `Content-Length`, and PHP
    /// never reads them.
    pub async fn fill<B>(
        self,
        first: Option<Bytes>,
        body: &mut B,
        limit: u64,
    ) -> Result<Filled, BoxError>
    where
        B: Body<Data = Bytes, Error = BoxError> + Unpin,
    {
        let mut pending = BytesMut::from(first.unwrap_or_default().as_ref());
        let mut written = 0u64;
        let mut after = None;
        let mut ended = false;
        loop {
            if pending.len() >= CHUNK {
                if let Err(kept) = self.write(&mut pending, &mut written).await {
                    return Ok(self.done(written, Some(kept), false));
                }
            }
            if body.is_end_stream() {
                ended = true;
                break;
            }
            let Some(frame) = body.frame().await.transpose()? else {
                ended = true;
                break;
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if written + (pending.len() + data.len()) as u64 > limit {
                after = Some(data);
                break;
            }
            pending.extend_from_slice(&data);
        }
        if let Err(mut kept) = self.write(&mut pending, &mut written).await {
            if let Some(data) = after {
                let mut both = BytesMut::from(kept.as_ref());
                both.extend_from_slice(&data);
                kept = both.freeze();
            }
            return Ok(self.done(written, Some(kept), false));
        }
        Ok(self.done(written, after, ended))
    }

    /// Writes and empties `pending`; on a disk error, hands its bytes back.
    async fn write(&self, pending: &mut BytesMut, written: &mut u64) -> Result<(), Bytes> {
        if pending.is_empty() {
            return Ok(());
        }
        let chunk = pending.split().freeze();
        let (file, at, bytes) = (self.file.clone(), *written, chunk.clone());
        let wrote = tokio::task::spawn_blocking(move || file.write_all_at(&bytes, at)).await;
        match wrote.map_err(io::Error::other).and_then(|r| r) {
            Ok(()) => {
                *written += chunk.len() as u64;
                Ok(())
            }
            Err(error) => {
                let dir = self.reservation.spool.dir.display();
                if let Some(held_back) = SPOOL_FAILED.allow() {
                    tracing::warn!(held_back, "cannot write a spooled upload in limits.spool_dir {dir}: {error}; the rest streams to its node");
                }
                Err(chunk)
            }
        }
    }

    fn done(mut self, written: u64, after: Option<Bytes>, ended: bool) -> Filled {
        self.reservation.shrink_to(written);
        let spooled = Spooled {
            file: self.file,
            len: written,
            read: 0,
            reading: None,
            _reservation: self.reservation,
        };
        Filled {
            spooled,
            after,
            ended,
        }
    }
}

/// A body on disk, read back in [`CHUNK`]s as its node takes it. Its file and its
/// share of the spool go when it is dropped.
#[derive(Debug)]
pub struct Spooled {
    file: Arc<File>,
    len: u64,
    read: u64,
    reading: Option<JoinHandle<io::Result<Bytes>>>,
    _reservation: Reservation,
}

impl Spooled {
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A spooled body could not be read back: the disk's fault, never the student's
/// or the node's.
#[derive(Debug)]
pub struct SpoolReadFailed(io::Error);

impl std::fmt::Display for SpoolReadFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a spooled upload could not be read back: {}", self.0)
    }
}

impl std::error::Error for SpoolReadFailed {}

impl Body for Spooled {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let reading = match &mut this.reading {
            Some(reading) => reading,
            None if this.read >= this.len => return Poll::Ready(None),
            None => {
                let n = CHUNK.min((this.len - this.read) as usize);
                let (file, at) = (this.file.clone(), this.read);
                this.reading.insert(tokio::task::spawn_blocking(move || {
                    let mut buf = vec![0; n];
                    file.read_exact_at(&mut buf, at)?;
                    Ok(Bytes::from(buf))
                }))
            }
        };
        let result = ready!(Pin::new(reading).poll(cx));
        this.reading = None;
        match result.map_err(io::Error::other).and_then(|r| r) {
            Ok(chunk) => {
                this.read += chunk.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Err(error) => Poll::Ready(Some(Err(Box::new(SpoolReadFailed(error))))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.reading.is_none() && self.read >= self.len
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len - self.read)
    }
}

#[cfg(test)]
mod tests;

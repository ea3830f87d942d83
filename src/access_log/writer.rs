//! The access log's writer thread: lines in batches, a flush on request, a reopen
//! after `SIGHUP`. Why a thread and not a task: a write to a slow disk blocks, and
//! must never hold a worker that serves students.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::AccessLogTo;
use crate::logs::Every;

/// Lines waiting for the writer: about a second of a busy site's traffic.
const QUEUE: usize = 16 * 1024;
/// The longest the writer keeps lines in its buffer.
const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// Failed writes, said at most once a minute.
static WRITE_FAILURES: Every = Every::new(Duration::from_secs(60));

/// What the writer thread is sent.
#[derive(Debug)]
pub(super) enum Message {
    /// One line, newline included.
    Line(String),
    /// Write out everything before this, then answer.
    Flush(mpsc::Sender<()>),
}

/// Opens where `to` says and starts the writer; `None` when the log is off. Returns
/// the queue and the flag that asks for a reopen.
pub(super) fn start(
    to: &AccessLogTo,
) -> io::Result<Option<(SyncSender<Message>, Arc<AtomicBool>)>> {
    let out = match to {
        AccessLogTo::Off => return Ok(None),
        AccessLogTo::Stderr => Out::Stderr,
        AccessLogTo::File(path) => Out::File(append(path)?, path.clone()),
    };
    let (lines, queued) = mpsc::sync_channel(QUEUE);
    let reopen = Arc::new(AtomicBool::new(false));
    let writer = Writer {
        out,
        reopen: reopen.clone(),
    };
    std::thread::Builder::new()
        .name("access-log".into())
        .spawn(move || writer.run(queued))?;
    Ok(Some((lines, reopen)))
}

/// A bounded channel's send that gives up when the queue stays full.
pub(super) trait SendOrDrop {
    fn send_timeout_or_drop(&self, message: Message) -> bool;
}

impl SendOrDrop for SyncSender<Message> {
    /// Tries for a second: the writer drains the queue unless its disk is stuck.
    fn send_timeout_or_drop(&self, message: Message) -> bool {
        let mut message = message;
        for _ in 0..100 {
            match self.try_send(message) {
                Ok(()) => return true,
                Err(TrySendError::Full(back)) => message = back,
                Err(TrySendError::Disconnected(_)) => return false,
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }
}

fn append(path: &PathBuf) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

enum Out {
    Stderr,
    File(File, PathBuf),
}

struct Writer {
    out: Out,
    reopen: Arc<AtomicBool>,
}

impl Writer {
    /// Writes lines in batches: when 32 KiB are waiting, and at least every
    /// [`FLUSH_EVERY`] (a steady trickle of requests must not keep lines, or a
    /// reopen, waiting), until every handle is gone.
    fn run(mut self, queued: Receiver<Message>) {
        let mut buffer = Vec::with_capacity(64 * 1024);
        let mut written = Instant::now();
        loop {
            let wait = FLUSH_EVERY.saturating_sub(written.elapsed());
            match queued.recv_timeout(wait) {
                Ok(Message::Line(line)) => buffer.extend_from_slice(line.as_bytes()),
                Ok(Message::Flush(done)) => {
                    self.write(&mut buffer);
                    let _ = done.send(());
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return self.write(&mut buffer),
            }
            if buffer.len() >= 32 * 1024 || written.elapsed() >= FLUSH_EVERY {
                self.write(&mut buffer);
                written = Instant::now();
            }
        }
    }

    fn write(&mut self, buffer: &mut Vec<u8>) {
        if self.reopen.swap(false, Ordering::Relaxed) {
            self.reopened();
        }
        if buffer.is_empty() {
            return;
        }
        let written = match &mut self.out {
            Out::Stderr => io::stderr().write_all(buffer),
            Out::File(file, _) => file.write_all(buffer),
        };
        if let Err(error) = written {
            // A full disk fails every batch: said once a minute.
            if let Some(held_back) = WRITE_FAILURES.allow() {
                tracing::warn!(
                    held_back,
                    "cannot write the access log: {error}; lines are lost"
                );
            }
        }
        buffer.clear();
    }

    fn reopened(&mut self) {
        let Out::File(file, path) = &mut self.out else {
            return;
        };
        match append(path) {
            Ok(reopened) => *file = reopened,
            Err(error) => tracing::warn!(
                "cannot reopen the access log {}: {error}; still writing to the old file",
                path.display()
            ),
        }
    }
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Out::Stderr => f.write_str("stderr"),
            Out::File(_, path) => write!(f, "{}", path.display()),
        }
    }
}

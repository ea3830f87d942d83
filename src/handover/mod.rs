//! A restart or an upgrade that refuses nobody, outside systemd: the new process
//! takes the listening sockets from the old one (`run --handover PATH`, both
//! processes started the same way).
//!
//! ```text
//! old: serving, listening on PATH             new: config checked, connects to PATH
//! old: sends its listening sockets (SCM_RIGHTS) ─▶ new: holds them, accepts nothing yet
//! old: follows its table, saves the state file, "saved" ─▶ new: loads it (table, admin
//!      states, waiting room), binds PATH for the next one, starts accepting, "serving"
//! old: stops accepting; finishes its requests within [timeouts] shutdown, sending each
//!      session they bind or forget ─▶ new: applies it; a session it misses meanwhile
//!      waits for "sync" ─▶ "synced": all the old one bound before it, in order
//! old: exits without saving again (the file is the new process's now) ─▶ new: EOF
//! ```
//!
//! Why this shape (pingora's `--upgrade`, HAProxy's `-x`), and not nginx's
//! re-exec on `USR2` with the sockets inherited across `exec`:
//! - **No parent-child dance.** Any supervisor (or a person in a shell) starts the
//!   new binary the way it started the old; nothing depends on which binary the
//!   old process would exec, and a new binary that cannot start leaves the old one
//!   serving (it hands over nothing until the new one has checked its config, and
//!   stops accepting only once the new one says "serving").
//! - **The state file is the table's carrier**, as across a plain restart: one
//!   format, one loader, the admin states and waiting-room places with it. It is
//!   written after the old process starts following its table, so the line stream
//!   holds everything the file may have missed; replaying a change twice does no
//!   harm.
//! - **The drain's sessions are streamed**, not left for a final save: a login the
//!   old process finishes binds a session whose student's next click reaches the
//!   new process within milliseconds. That click may still outrun the line, so a
//!   session the new table misses while the old process lives costs one round
//!   trip on this socket: the old process answers "synced" only after every change
//!   it learned before, and it learned the login before it answered it.
//! - **No connection is refused.** Both processes hold the same sockets; while
//!   neither accepts (the new one loading the table), the kernel queues new
//!   connections in the socket's backlog.
//!
//! Only a process of the same user may connect (checked by `SO_PEERCRED`), and
//! `PATH` is created readable and writable by that user alone: whoever holds the
//! socket may take the students.

mod wire;

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::app::App;
use crate::gateway::Gateway;
use crate::sessions::affinity::Change;
use crate::store::Local;
use wire::Line;

/// How long the new process waits for the old one's state file to be written (a
/// million sessions take a few seconds).
const SAVE_WAIT: Duration = Duration::from_secs(120);

/// How long the old process may take, after its drain, to send the last changes.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// The longest a request with an unknown session waits for the old process's
/// "synced". It answers in well under a millisecond on a quiet machine; on one
/// starved of CPU (a restart in the middle of a surge) it took over a second, and
/// a student who had just logged in was dealt afresh: logged out. Only requests
/// whose session this process does not know wait, only while the old one lives.
const CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// A catch-up that timed out is said at most once every ten seconds.
static NOT_SYNCED: crate::logs::Every = crate::logs::Every::new(Duration::from_secs(10));

/// The requests waiting for "synced", in the order their "sync" went out; the
/// writer is `None` once the old process has gone (nothing more to wait for).
type Waiters = Arc<std::sync::Mutex<(Option<UnixStream>, VecDeque<oneshot::Sender<()>>)>>;

/// The new process's side: what the old one handed over, and its line stream.
#[derive(Debug)]
pub struct Predecessor {
    sockets: Vec<(String, TcpListener)>,
    lines: BufReader<UnixStream>,
}

/// Takes over from the gateway process listening on `path`, if one is; `None`
/// when there is none (no socket there, or a stale one left by a process that
/// died: removed). Returns once the old process has saved its state file, so the
/// table can be loaded from it. Blocking: called before the runtime starts.
pub fn take_over(path: &Path) -> io::Result<Option<Predecessor>> {
    let stream = match UnixStream::connect(path) {
        Ok(stream) => stream,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path)?;
            return Ok(None);
        }
        Err(error) => return Err(error),
    };
    stream.set_read_timeout(Some(SAVE_WAIT))?;
    let sockets = wire::receive_sockets(&stream)?;
    let mut lines = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line)? == 0 {
            return Err(io::Error::other("the old process left before saving"));
        }
        if Line::parse(line.trim_end()) == Some(Line::Saved) {
            break;
        }
    }
    lines.get_ref().set_read_timeout(None)?;
    Ok(Some(Predecessor { sockets, lines }))
}

impl Predecessor {
    /// The listening sockets, each with its role (`public`, `admin`, `redirect`).
    pub fn take_sockets(&mut self) -> Vec<(String, TcpListener)> {
        std::mem::take(&mut self.sockets)
    }

    /// Tells the old process this one is accepting (it stops), then applies what
    /// its last requests bind and forget until it exits. On a thread of its own:
    /// the table is synchronous, and the stream ends with the old process.
    pub fn follow(self, gateway: Arc<Gateway>) -> io::Result<()> {
        let mut lines = self.lines;
        let mut writer = lines.get_ref().try_clone()?;
        writer.write_all(Line::Serving.text().as_bytes())?;
        let waiters: Waiters = Arc::new(std::sync::Mutex::new((Some(writer), VecDeque::new())));
        gateway.catch_up_with(catch_up(waiters.clone()));
        std::thread::Builder::new()
            .name("handover".into())
            .spawn(move || {
                let applied = apply(&mut lines, &gateway, &waiters);
                let mut waiting = waiters.lock().unwrap_or_else(|p| p.into_inner());
                waiting.0 = None;
                for waiter in waiting.1.drain(..) {
                    let _ = waiter.send(());
                }
                tracing::info!(applied, "the previous process has finished and exited");
            })?;
        Ok(())
    }
}

/// Asks the old process for "synced" and waits for it (at most [`CATCH_UP_WAIT`]);
/// at once when it has gone.
fn catch_up(waiters: Waiters) -> crate::gateway::CatchUp {
    crate::gateway::CatchUp(Box::new(move || {
        let (done, synced) = oneshot::channel();
        {
            let mut waiting = waiters.lock().unwrap_or_else(|p| p.into_inner());
            let (writer, queue) = &mut *waiting;
            let asked = writer
                .as_mut()
                .map(|w| w.write_all(Line::Sync.text().as_bytes()));
            match asked {
                Some(Ok(())) => queue.push_back(done),
                _ => drop(done),
            }
        }
        Box::pin(async move {
            if tokio::time::timeout(CATCH_UP_WAIT, synced).await.is_err() {
                if let Some(held_back) = NOT_SYNCED.allow() {
                    tracing::warn!(
                        held_back,
                        "the previous process did not say \"synced\" within {CATCH_UP_WAIT:?}: \
                         a session it bound since may be dealt afresh"
                    );
                }
            }
        })
    }))
}

/// Applies the old process's changes until it exits, answering each "synced" to
/// its waiter; returns how many changes.
fn apply(lines: &mut impl BufRead, gateway: &Gateway, waiters: &Waiters) -> usize {
    let table = gateway.table();
    let mut applied = 0;
    for line in lines.lines().map_while(Result::ok) {
        match Line::parse(&line) {
            Some(Line::Bind(key, state, node)) => match gateway.node_id(&node) {
                Some(id) => table.bind(key, id, state),
                // A node the new config no longer has: dealt afresh.
                None => continue,
            },
            Some(Line::Forget(key)) => {
                table.forget(key);
            }
            Some(Line::Synced) => {
                let mut waiting = waiters.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(waiter) = waiting.1.pop_front() {
                    let _ = waiter.send(());
                }
                continue;
            }
            Some(Line::Saved | Line::Serving | Line::Sync) | None => continue,
        }
        applied += 1;
    }
    applied
}

/// The old process's side: waits on `path` for a successor.
#[derive(Debug)]
pub struct Handover {
    path: PathBuf,
    /// Stops the task (shutdown without a successor), or has it send the last
    /// changes (after the drain).
    finish: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Handover {
    /// Listens on `path` (replacing what is there: the previous process's socket,
    /// which it no longer reads) for a successor, which gets `sockets` (each with
    /// its role) and `app`'s table. `successor_serving` fires once a successor
    /// accepts in this process's stead: then this one stops accepting.
    pub fn start(
        path: &Path,
        sockets: Vec<(&'static str, TcpListener)>,
        app: App,
        successor_serving: oneshot::Sender<()>,
    ) -> io::Result<Self> {
        match std::fs::remove_file(path) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        let listener = tokio::net::UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let (finish, finishing) = oneshot::channel();
        let waiting = Waiting {
            listener,
            sockets,
            app,
            changes: None,
        };
        let task = tokio::spawn(waiting.run(successor_serving, finishing));
        Ok(Self {
            path: path.to_owned(),
            finish,
            task,
        })
    }

    /// After the drain: sends the successor the last changes (or stops waiting
    /// for one), within [`FLUSH_WAIT`].
    pub async fn finish(self) {
        let _ = self.finish.send(());
        if tokio::time::timeout(FLUSH_WAIT, self.task).await.is_err() {
            tracing::warn!(
                "the handover on {} did not finish in time",
                self.path.display()
            );
        }
    }
}

/// The task behind [`Handover`].
struct Waiting {
    listener: tokio::net::UnixListener,
    sockets: Vec<(&'static str, TcpListener)>,
    app: App,
    /// The table's changes, followed from the first successor's arrival on.
    changes: Option<mpsc::UnboundedReceiver<Change>>,
}

impl Waiting {
    async fn run(mut self, serving: oneshot::Sender<()>, mut finishing: oneshot::Receiver<()>) {
        let mut serving = Some(serving);
        loop {
            let stream = tokio::select! {
                accepted = self.listener.accept() => accepted,
                _ = &mut finishing => return,
            };
            let stream = match stream {
                Ok((stream, _)) if same_user(&stream) => stream,
                Ok(_) => {
                    tracing::warn!("handover refused: the process asking runs as another user");
                    continue;
                }
                Err(error) => {
                    tracing::warn!("handover socket: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            tracing::info!("a new gateway process is taking over");
            match self.hand_over(stream, &mut serving, &mut finishing).await {
                Ok(()) => return,
                Err(error) => {
                    // It died, or could not start: this one goes on serving, and
                    // saves again when it stops.
                    self.app.cancel_handover();
                    tracing::error!("handover failed, this process goes on serving: {error}");
                }
            }
        }
    }

    /// One successor: the sockets, the saved table, then every change until this
    /// process has finished its requests.
    async fn hand_over(
        &mut self,
        stream: tokio::net::UnixStream,
        serving: &mut Option<oneshot::Sender<()>>,
        finishing: &mut oneshot::Receiver<()>,
    ) -> io::Result<()> {
        stream.writable().await?;
        let sockets: Vec<_> = self.sockets.iter().map(|(r, l)| (*r, l)).collect();
        wire::send_sockets(&stream, &sockets)?;
        let gateway = self.app.gateway().clone();
        if self.changes.is_none() {
            self.changes = gateway.table().follow();
        }
        let Some(changes) = self.changes.as_mut() else {
            return Err(io::Error::other("the table is followed already"));
        };
        if !self.app.save_for_successor().await {
            tracing::warn!(
                "no state file to hand over ([state] file): the new process starts with \
                 the sessions bound from now on only"
            );
        }
        let (reading, mut writing) = stream.into_split();
        writing.write_all(Line::Saved.text().as_bytes()).await?;
        let mut replies = tokio::io::BufReader::new(reading).lines();
        let mut listening = true;
        loop {
            tokio::select! {
                change = changes.recv() => {
                    let Some(change) = change else { return Ok(()) };
                    if let Some(line) = line_for(&gateway, change) {
                        writing.write_all(line.text().as_bytes()).await?;
                    }
                }
                reply = replies.next_line(), if listening => match reply?.as_deref().map(Line::parse) {
                    Some(Some(Line::Serving)) => {
                        tracing::info!("the new process is accepting: this one stops accepting");
                        if let Some(serving) = serving.take() {
                            let _ = serving.send(());
                        }
                    }
                    Some(Some(Line::Sync)) => {
                        // Everything learned before the ask, then the answer.
                        while let Ok(change) = changes.try_recv() {
                            if let Some(line) = line_for(&gateway, change) {
                                writing.write_all(line.text().as_bytes()).await?;
                            }
                        }
                        writing.write_all(Line::Synced.text().as_bytes()).await?;
                    }
                    Some(_) => {}
                    None if serving.is_some() => {
                        return Err(io::Error::other("the new process left before serving"));
                    }
                    None => listening = false,
                },
                _ = &mut *finishing => break,
            }
        }
        while let Ok(change) = changes.try_recv() {
            if let Some(line) = line_for(&gateway, change) {
                writing.write_all(line.text().as_bytes()).await?;
            }
        }
        writing.flush().await
    }
}

/// A table change as its line, by node name.
fn line_for(gateway: &Gateway, change: Change) -> Option<Line> {
    Some(match change {
        Change::Bound(key, node, state) => Line::Bind(key, state, gateway.node_name(node)?),
        Change::Forgotten(key) => Line::Forget(key),
    })
}

/// Whether the peer runs as this process's user (or as root).
fn same_user(stream: &tokio::net::UnixStream) -> bool {
    let Ok(peer) = rustix::net::sockopt::socket_peercred(stream) else {
        return false;
    };
    peer.uid == rustix::process::getuid() || peer.uid.is_root()
}

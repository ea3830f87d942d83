//! Keep-alive connections to the upstreams, each driven by the request using it.
//!
//! Why not hyper-util's pooled client: it runs every upstream connection as a task of
//! its own, so a proxied request is handed to that task through a channel, its
//! response comes back through another, and three tasks wake for one exchange. Here
//! the request's own task drives the connection ([`crate::http::h1::client`]): while it
//! waits for the response head ([`Lease::send`]) and inside the response body while
//! that streams to the student ([`NodeBody`]). An idle connection is a plain value in
//! its upstream's [`Conns`] list that nobody polls.
//!
//! An idle connection the node closed is found when it is taken: the reactor says
//! whether its socket has anything to report, and one read tells whether that is a
//! FIN. A request that a reused connection could not even start to send (the node
//! closed it in that very moment) is sent again on another connection: it comes
//! back untouched, so nothing can reach a node twice.
//!
//! Which kept connection a request may take ([`Reuse`]): a student's first request
//! on a new connection of theirs gets only a connection that has been quiet for
//! [`QUIET`], or a new one. Why: a node that sent bytes after an answer that looked
//! complete (a PHP script writing on after its `Content-Length`, a late error page)
//! would hand them to the next request on that connection as its answer. The check
//! when a connection is taken sees bytes that have arrived, never those still on
//! their way; a connection another student used a moment ago is exactly one whose
//! late bytes may still be on their way. HAProxy's default (`http-reuse safe`)
//! gives a client's first request a connection of its own always; waiting for
//! quiet instead keeps that guarantee for the late bytes that matter (a node's
//! stray answer comes within milliseconds to a few hundred), and still saves the
//! connect on a site that is not at its peak. A student's later requests take any
//! kept connection, as with HAProxy: a student has by then been answered over this
//! pool and a failed reuse is retried on a fresh connection (see
//! [`Lease::send`]).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::uri::Authority;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::net::TcpStream;

use crate::http::body::splice::{Pipe, Splice};
use crate::http::body::stall::WriteStall;
use crate::http::body::BoxError;
use crate::http::body::RequestBody;
use crate::http::h1::client::{ClientError, Connection};
use crate::http::upstream::fault::ConnectFault;

/// How long a kept connection must have been idle before a student's first request
/// may take it (see the module's note): longer than a node's late bytes take.
pub const QUIET: Duration = Duration::from_secs(1);

/// Which kept connections a request may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Any kept connection still open (a student's later requests).
    Any,
    /// Only one idle for [`QUIET`] or more (a student's first request on a new
    /// connection, and anything of unknown origin).
    Quiet,
}

/// Idle connections kept per upstream. More than this many concurrent requests to
/// one node open connections that are closed after their exchange instead of kept:
/// a PHP node rarely has more workers than this, and every kept connection holds
/// one of the node's (nginx or Apache) keep-alive slots.
pub const MAX_IDLE: usize = 256;

/// How connections to the upstreams are opened and how long they may idle, fixed
/// at start (`timeouts.connect`, `upstream_idle` and `body_idle`).
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    connect: Duration,
    idle: Duration,
    stall: Duration,
}

impl Pool {
    /// A pool that connects within `connect`, keeps connections idle at most `idle`,
    /// and cuts a connection whose writes stay blocked for `stall`.
    pub fn new(connect: Duration, idle: Duration, stall: Duration) -> Self {
        Self {
            connect,
            idle,
            stall,
        }
    }

    /// How long a connection may idle before it is closed.
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// A connection to `authority`: an idle one from `conns` that `reuse` allows if
    /// one is still open, else a new one. The flag says whether it was reused.
    pub async fn lease(
        &self,
        authority: &Authority,
        conns: &Arc<Conns>,
        reuse: Reuse,
    ) -> Result<(Lease, bool), ConnectError> {
        if let Some(lease) = conns.take(self.idle, reuse) {
            return Ok((lease, true));
        }
        let stream = tokio::time::timeout(self.connect, TcpStream::connect(authority.as_str()))
            .await
            .map_err(|_| ConnectError::TimedOut)?
            .map_err(ConnectError::Io)?;
        stream.set_nodelay(true).map_err(ConnectError::Io)?;
        let conn = Box::new(Connection::new(WriteStall::new(stream, self.stall)));
        let lease = Lease {
            conn,
            home: conns.clone(),
        };
        Ok((lease, false))
    }
}

/// Why a connection to a node could not be opened.
#[derive(Debug)]
pub enum ConnectError {
    /// Nothing answered within `timeouts.connect`.
    TimedOut,
    /// Refused, unreachable, or the name did not resolve.
    Io(io::Error),
}

impl ConnectError {
    /// Whose fault it is: a timeout is the node's (it did not accept in time);
    /// an I/O error says so itself (see [`ConnectFault`]).
    pub fn fault(&self) -> ConnectFault {
        match self {
            Self::TimedOut => ConnectFault::Upstream,
            Self::Io(error) => ConnectFault::of(error),
        }
    }
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TimedOut => f.write_str("connect timed out"),
            Self::Io(error) => write!(f, "connect failed: {error}"),
        }
    }
}

impl std::error::Error for ConnectError {}

/// One upstream's idle connections, most recently used last. Shared by the config
/// generations that keep the upstream's address. The lock is held for a push or a
/// pop, never across I/O.
#[derive(Default)]
pub struct Conns {
    idle: Mutex<VecDeque<Idle>>,
}

impl std::fmt::Debug for Conns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns").field("idle", &self.len()).finish()
    }
}

/// A connection's state (socket, framing, the queued request) is a few hundred
/// bytes: boxed once per connection, so that a lease moves through the request's
/// futures as a pointer.
type Conn = Box<Connection>;

struct Idle {
    conn: Conn,
    /// When it was put back, on the coarse clock ([`crate::clock`]): every request
    /// puts one back and takes one, and the idle limit is seconds.
    since: Duration,
}

impl Idle {
    fn idle_for(&self) -> Duration {
        crate::clock::coarse().saturating_sub(self.since)
    }
}

impl Conns {
    /// Idle connections kept now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no connection is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently used connection that `reuse` allows, still open and idle
    /// at most `limit`. Closed and expired ones met on the way are dropped (outside
    /// the lock).
    fn take(self: &Arc<Self>, limit: Duration, reuse: Reuse) -> Option<Lease> {
        let mut noop = Context::from_waker(Waker::noop());
        loop {
            let mut idle = {
                let mut list = self.lock();
                let at = match reuse {
                    Reuse::Any => list.len().checked_sub(1)?,
                    // Older ones are quieter still: the newest of those quiet enough.
                    Reuse::Quiet => list.iter().rposition(|idle| idle.idle_for() >= QUIET)?,
                };
                list.remove(at)?
            };
            if idle.idle_for() > limit {
                // Everything older is older still: the list's front.
                let expired: Vec<Idle> = {
                    let mut list = self.lock();
                    let old = list.iter().take_while(|i| i.idle_for() > limit).count();
                    list.drain(..old).collect()
                };
                drop((idle, expired));
                return None;
            }
            if idle.conn.poll_unusable(&mut noop) {
                continue;
            }
            return Some(Lease {
                conn: idle.conn,
                home: self.clone(),
            });
        }
    }

    /// Drops the connections idle longer than `limit` and those the node closed
    /// meanwhile; returns how many are kept. The sweeper runs it, so that a quiet
    /// upstream's connections do not sit half-closed until its next request.
    pub fn prune(&self, limit: Duration) -> usize {
        let mut noop = Context::from_waker(Waker::noop());
        let all = std::mem::take(&mut *self.lock());
        let mut kept: VecDeque<Idle> = all
            .into_iter()
            .filter_map(|mut idle| {
                let open = !idle.conn.poll_unusable(&mut noop);
                (open && idle.idle_for() <= limit).then_some(idle)
            })
            .collect();
        let mut list = self.lock();
        // Connections put back meanwhile are the most recently used: they go last.
        kept.extend(list.drain(..));
        *list = kept;
        list.len()
    }

    fn put(&self, conn: Conn) {
        let idle = Idle {
            conn,
            since: crate::clock::coarse(),
        };
        let mut list = self.lock();
        let evicted = (list.len() >= MAX_IDLE).then(|| list.pop_front());
        list.push_back(idle);
        drop(list);
        drop(evicted);
    }
}

/// A connection in use by one request, back to its upstream's list once the response
/// has been read in full (see [`NodeBody`]); dropped, and so closed, otherwise.
pub struct Lease {
    conn: Conn,
    home: Arc<Conns>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("conn", &self.conn).finish()
    }
}

/// A request that failed, with the request itself when none of it left.
#[derive(Debug)]
pub struct SendError {
    /// What went wrong.
    pub error: ClientError,
    /// The request, untouched, when the connection was found closed before any of
    /// it was written.
    pub unsent: Option<Request<RequestBody>>,
    /// The head of the request as it was sent, when it was and the answer's head
    /// was not parsed (its body, if any, is gone). Whether the request may go again
    /// is the caller's to judge, from `error`.
    pub sent_head: Option<Parts>,
}

impl Lease {
    /// Sends `request` and waits for the response head, driving the connection
    /// (and with it the upload) meanwhile, at most `head_wait` once the request is
    /// out. `reused` says the connection has idled since it was opened: it is
    /// checked once more before anything is written.
    pub async fn send(
        mut self,
        request: Request<RequestBody>,
        reused: bool,
        head_wait: Duration,
    ) -> Result<Response<NodeBody>, SendError> {
        if reused && poll_fn(|cx| Poll::Ready(self.conn.poll_unusable(cx))).await {
            return Err(SendError {
                error: ClientError::ClosedBeforeAnswer,
                unsent: Some(request),
                sent_head: None,
            });
        }
        let head = match self.conn.start(request, head_wait) {
            Ok(()) => poll_fn(|cx| self.conn.poll_head(cx)).await,
            Err(error) => Err(error),
        };
        match head {
            Ok(head) => Ok(head.map(|()| NodeBody::leased(self))),
            Err(error) => Err(SendError {
                error,
                unsent: None,
                sent_head: self.conn.take_request_head(),
            }),
        }
    }

    /// Returns the connection to its upstream's list if the exchange left it clean
    /// (see [`Connection::finish`]): a connection still sending an upload the node
    /// answered early (a 413 before the end of the body) is dropped rather than
    /// kept with the student's upload stuck in it.
    fn release(mut self) {
        if self.conn.finish() {
            self.home.put(self.conn);
        }
    }
}

/// A node's response body, which also drives the node's connection while it streams
/// and returns the connection for reuse once the body has been read in full. A body
/// dropped before its end (the student left) drops the connection with it: a
/// half-read response cannot be reused.
pub struct NodeBody {
    source: Source,
    /// The node's slot this exchange holds (a cap per node): let go the moment the
    /// body ends, because the PHP worker is free then, or when it is dropped.
    held: Option<Arc<dyn Held>>,
}

enum Source {
    /// Read over a pooled connection, `None` once that has gone back or failed;
    /// with the error that ended it, held back for one poll so that hyper writes
    /// out what it already has first.
    Leased(Option<Lease>, Option<ClientError>),
    /// hyper's, from a connection something else drives (an upgrade's).
    Detached(Incoming),
}

/// Something a request holds of its node while the node works for it, such as a
/// slot under the node's cap, let go once the node's answer has been read. A
/// trait so that `http` knows nothing of what it is; an `Arc` so that handing one
/// over allocates nothing.
pub trait Held: Send + Sync {
    /// The node is done with the request.
    fn release(&self);
}

impl std::fmt::Debug for NodeBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("NodeBody");
        match &self.source {
            Source::Leased(lease, failed) => debug.field("lease", lease).field("failed", failed),
            Source::Detached(_) => debug.field("detached", &true),
        };
        debug.field("held", &self.held.is_some()).finish()
    }
}

impl NodeBody {
    /// The body of the answer just read over `lease`.
    fn leased(lease: Lease) -> Self {
        let mut body = Self {
            source: Source::Leased(Some(lease), None),
            held: None,
        };
        // An answer without a body frees its connection at once.
        body.release_if_done();
        body
    }

    /// `incoming` from a connection something else drives (an upgrade's).
    pub fn detached(incoming: Incoming) -> Self {
        Self {
            source: Source::Detached(incoming),
            held: None,
        }
    }

    /// Keeps `held` until this body ends or is dropped.
    pub fn hold(&mut self, held: Arc<dyn Held>) {
        self.held = Some(held);
    }

    fn let_go(&mut self) {
        if let Some(held) = self.held.take() {
            held.release();
        }
    }

    /// Gives the connection back once the whole answer has been read; says
    /// whether the answer has been.
    fn release_if_done(&mut self) -> bool {
        let Source::Leased(lease, _) = &mut self.source else {
            return false;
        };
        match lease.take_if(|lease| lease.conn.is_done()) {
            Some(lease) => {
                lease.release();
                true
            }
            None => lease.is_none(),
        }
    }
}

impl Body for NodeBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = match &mut this.source {
            Source::Detached(incoming) => match Pin::new(incoming).poll_frame(cx) {
                Poll::Ready(frame) => frame.map(|frame| frame.map_err(Into::into)),
                Poll::Pending => return Poll::Pending,
            },
            Source::Leased(None, _) => None,
            Source::Leased(Some(lease), failed) => match failed.take() {
                Some(error) => Some(Err(Box::new(error) as BoxError)),
                None => match lease.conn.poll_data(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(data))) => Some(Ok(Frame::data(data))),
                    Poll::Ready(None) => None,
                    Poll::Ready(Some(Err(error))) => {
                        // The node closed or failed mid-body. Let hyper flush what
                        // it already has before it sees the error and aborts: the
                        // student gets every byte that arrived, on a connection
                        // that is then cut.
                        *failed = Some(error);
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                },
            },
        };
        match &frame {
            Some(Err(_)) => {
                if let Source::Leased(lease, _) = &mut this.source {
                    drop(lease.take());
                }
            }
            // The last piece of a sized body ends it too: the PHP worker and the
            // connection are free before hyper asks again.
            _ => {
                if this.release_if_done() || frame.is_none() {
                    this.let_go();
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Detached(incoming) => incoming.is_end_stream(),
            Source::Leased(None, _) => true,
            Source::Leased(Some(lease), _) => lease.conn.is_done(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Detached(incoming) => incoming.size_hint(),
            Source::Leased(None, _) => SizeHint::with_exact(0),
            Source::Leased(Some(lease), _) => match lease.conn.remaining() {
                Some(left) => SizeHint::with_exact(left),
                None => SizeHint::default(),
            },
        }
    }
}

impl Splice for NodeBody {
    fn can_splice(&self) -> bool {
        matches!(&self.source, Source::Leased(Some(lease), None) if lease.conn.can_splice())
    }

    fn poll_splice(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &mut Pipe,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        let this = &mut *self;
        let Source::Leased(Some(lease), None) = &mut this.source else {
            return Poll::Ready(Err("the node's body cannot splice now".into()));
        };
        match ready!(lease.conn.poll_splice(cx, pipe, max)) {
            Ok(moved) => {
                // As a frame's: the last byte frees the node's connection and slot.
                if this.release_if_done() {
                    this.let_go();
                }
                Poll::Ready(Ok(moved))
            }
            Err(error) => {
                // Nothing is left unsent: the pipe was empty when this fill began.
                if let Source::Leased(lease, _) = &mut this.source {
                    drop(lease.take());
                }
                Poll::Ready(Err(Box::new(error)))
            }
        }
    }
}

impl Drop for NodeBody {
    fn drop(&mut self) {
        self.let_go();
        self.release_if_done();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A node that accepts connections and hands them to the test.
    async fn node() -> (Authority, tokio::sync::mpsc::UnboundedReceiver<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string().parse().unwrap();
        let (accepted, streams) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = accepted.send(stream);
            }
        });
        (authority, streams)
    }

    fn pool() -> Pool {
        let second = Duration::from_secs(1);
        Pool::new(second, Duration::from_secs(60), second)
    }

    #[tokio::test]
    async fn the_sweep_drops_connections_the_node_closed_and_keeps_the_rest() {
        let (authority, mut streams) = node().await;
        let conns = Arc::new(Conns::default());
        let (one, _) = pool().lease(&authority, &conns, Reuse::Any).await.unwrap();
        let (two, _) = pool().lease(&authority, &conns, Reuse::Any).await.unwrap();
        one.release();
        two.release();
        let (first, _second) = (streams.recv().await.unwrap(), streams.recv().await.unwrap());
        assert_eq!(conns.prune(Duration::from_secs(60)), 2);

        drop(first);
        let mut kept = 2;
        for _ in 0..200 {
            kept = conns.prune(Duration::from_secs(60));
            if kept < 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(kept, 1, "the connection the node closed is still kept");
    }

    fn get() -> Request<RequestBody> {
        let body = RequestBody::empty();
        let mut request = Request::new(body);
        request
            .headers_mut()
            .insert(http::header::HOST, http::HeaderValue::from_static("node"));
        request
    }

    /// The node closes a kept connection just as a request takes it: the request must
    /// come back unsent (the caller then opens another connection), not wait for ever
    /// on a connection nobody reads.
    #[tokio::test]
    async fn a_kept_connection_closed_as_it_is_taken_hands_the_request_back() {
        let (authority, mut streams) = node().await;
        let conns = Arc::new(Conns::default());
        let (lease, _) = pool().lease(&authority, &conns, Reuse::Any).await.unwrap();
        let answered = lease.send(get(), false, Duration::from_secs(10));
        let node_side = async {
            let mut stream = streams.recv().await.unwrap();
            let mut head = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut head).await;
            let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            tokio::io::AsyncWriteExt::write_all(&mut stream, answer)
                .await
                .unwrap();
            stream
        };
        let (response, stream) = tokio::join!(answered, node_side);
        let body = response.unwrap().into_body();
        http_body_util::BodyExt::collect(body).await.unwrap();
        assert_eq!(conns.len(), 1, "the connection was kept");

        let (lease, reused) = pool().lease(&authority, &conns, Reuse::Any).await.unwrap();
        assert!(reused);
        drop(stream);
        // Lets the node's FIN arrive before the request is sent.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            lease.send(get(), true, Duration::from_secs(10)),
        )
        .await;
        let failed = sent.expect("the request hung").unwrap_err();
        assert!(failed.unsent.is_some(), "the request was not handed back");
    }

    /// Counts its releases, as a node's slot would.
    #[derive(Default)]
    struct Slot(std::sync::atomic::AtomicUsize);

    impl Held for Slot {
        fn release(&self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A node's large answer, read as the students' side reads it: what came with
    /// the head in frames, the rest by splice. At its last byte the connection goes
    /// back to the pool, clean for the next exchange, and the node's slot is let go.
    #[tokio::test]
    async fn a_spliced_body_gives_its_connection_and_slot_back_at_its_last_byte() {
        use crate::http::body::splice::{Pipe, Splice, PIPE_FILL};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const LENGTH: usize = 300_000;
        let file = crate::http::body::splice::patterned(LENGTH);
        let (authority, mut streams) = node().await;
        let conns = Arc::new(Conns::default());
        let (lease, _) = pool().lease(&authority, &conns, Reuse::Any).await.unwrap();
        let answered = lease.send(get(), false, Duration::from_secs(10));
        let mut node_stream = streams.recv().await.unwrap();
        let mut head = [0u8; 1024];
        // The node answers while the body is read, as a node does: its writes may
        // wait for the reader.
        let answering = {
            let file = file.clone();
            tokio::spawn(async move {
                let _ = node_stream.read(&mut head).await.unwrap();
                let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {LENGTH}\r\n\r\n");
                node_stream.write_all(answer.as_bytes()).await.unwrap();
                node_stream.write_all(&file).await.unwrap();
                node_stream
            })
        };
        let response = tokio::time::timeout(Duration::from_secs(10), answered).await;
        let mut body = response.expect("the head came").unwrap().into_body();
        let slot = Arc::new(Slot::default());
        body.hold(slot.clone());

        let student = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut to = TcpStream::connect(student.local_addr().unwrap())
            .await
            .unwrap();
        let (mut from, _) = student.accept().await.unwrap();
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            from.read_to_end(&mut got).await.map(|_| got)
        });
        let mut pipe = Pipe::new().unwrap();
        let mut spliced = 0;
        let read_out = async {
            while !body.is_end_stream() {
                if body.can_splice() {
                    let moved =
                        poll_fn(|cx| Pin::new(&mut body).poll_splice(cx, &mut pipe, PIPE_FILL));
                    spliced += moved.await.unwrap();
                    while pipe.held() > 0 {
                        poll_fn(|cx| pipe.poll_drain(cx, &to)).await.unwrap();
                    }
                } else {
                    let frame = http_body_util::BodyExt::frame(&mut body).await;
                    let data = frame.unwrap().unwrap().into_data().unwrap();
                    to.write_all(&data).await.unwrap();
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read_out)
            .await
            .expect("the body was read out");
        let mut node_stream = answering.await.unwrap();
        assert!(spliced > 0, "nothing went by splice");
        assert_eq!(slot.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(conns.len(), 1, "the connection was not kept");
        drop(to);
        assert!(
            reading.await.unwrap().unwrap() == file,
            "the file arrived changed"
        );

        // The kept connection carries the next exchange from its first byte.
        let (lease, reused) = pool().lease(&authority, &conns, Reuse::Any).await.unwrap();
        assert!(reused);
        let answered = lease.send(get(), true, Duration::from_secs(10));
        let node_side = async {
            let mut head = [0u8; 1024];
            let _ = node_stream.read(&mut head).await.unwrap();
            let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext";
            node_stream.write_all(answer).await.unwrap();
        };
        let (response, ()) = tokio::join!(answered, node_side);
        let next = http_body_util::BodyExt::collect(response.unwrap().into_body());
        assert_eq!(&next.await.unwrap().to_bytes()[..], b"next");
    }

    #[tokio::test]
    async fn the_sweep_drops_connections_idle_past_the_limit() {
        let (authority, _streams) = node().await;
        let conns = Arc::new(Conns::default());
        let (lease, _) = pool().lease(&authority, &conns, Reuse::Any).await.unwrap();
        lease.release();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(conns.prune(Duration::from_millis(1)), 0);
        assert!(conns.is_empty());
    }

    #[tokio::test]
    async fn a_first_request_takes_only_a_connection_seen_quiet() {
        let (authority, _streams) = node().await;
        let conns = Arc::new(Conns::default());
        let (lease, _) = pool().lease(&authority, &conns, Reuse::Any).await.unwrap();
        lease.release();
        assert!(conns.take(Duration::from_secs(60), Reuse::Quiet).is_none());
        assert_eq!(conns.len(), 1, "left for a later request");
        let later = conns.take(Duration::from_secs(60), Reuse::Any);
        later.expect("any request may take it").release();
        // Once quiet, a first request may take it too.
        conns.lock().back_mut().unwrap().since = Duration::ZERO;
        assert!(conns.take(Duration::MAX, Reuse::Quiet).is_some());
    }
}

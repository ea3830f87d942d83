//! A large answer's body moved from the node's socket to the student's inside the
//! kernel, through a pipe (`splice(2)`), instead of read into the gateway's memory
//! and written out again.
//!
//! Why: on a 1 MiB SCORM file nearly all of the gateway's work is those two copies
//! of every byte and the calls that make them. Spliced, the bytes are never
//! copied to user space: on loopback a relay loop moved 1 MiB for about half the
//! CPU of reading and writing it 16 KiB at a time. It pays only for a body the
//! gateway does not look at: a node's answer sized by `Content-Length`, going to a
//! student on plain HTTP/1.x (TLS encrypts in user space), not being copied into
//! the asset cache. Every other body keeps its frames.
//!
//! What a body's frames do on their way, a splice does too: each layer that wraps
//! a node's body implements [`Splice`] the way it implements `poll_frame` (the
//! node's idle limit, the access log's byte count, the node slot given back at the
//! body's last byte), and the student's side keeps its own rules (the write stall,
//! one node buffer at a time for a reader who has not shown they keep up).
//!
//! The pipe is filled only when it is empty and emptied before it is filled again,
//! so an `EAGAIN` always belongs to the socket it was waited for: the pipe itself
//! never waits, and needs no registration with the runtime. A pipe an answer left
//! empty is kept by its thread for the next one (up to [`KEEP`] each, while pipes
//! are plentiful): made and closed per answer, it cost 5 % of a 1 MiB file's CPU.

use std::cell::RefCell;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body_util::{Either, Full};

use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::http::body::BoxError;

/// The most one fill moves: a pipe's default capacity (16 pages of 4 KiB). A pipe
/// made smaller (past `/proc/sys/fs/pipe-user-pages-soft`) only moves less a call.
pub(crate) const PIPE_FILL: usize = 64 * 1024;

/// The most pipes open at once, process-wide, the kept ones included: a pipe is two
/// file descriptors, and the open-file limit counts them ([`crate::open_files`]
/// reserves `2 × MAX_PIPES`), so that, where the hard limit allows what the gateway
/// asks for, no student is refused a connection for a pipe's sake. Past it, a large
/// answer is copied as a small one is.
pub(crate) const MAX_PIPES: usize = 1024;

/// Pipes open now.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// Empty pipes a thread keeps for its next large answers, at most.
pub(crate) const KEEP: usize = 8;

thread_local! {
    /// Empty pipes kept for this thread's next large answers: making a pipe and
    /// closing it are three system calls and the kernel's allocations.
    static KEPT: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

/// A pipe between two sockets, and how many bytes it holds.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    held: usize,
}

impl Pipe {
    /// A new, empty pipe (two file descriptors, closed when it drops); an error
    /// past [`MAX_PIPES`] or when the process has no descriptor left.
    pub fn new() -> io::Result<Self> {
        if !take_place(&OPEN, MAX_PIPES) {
            return Err(io::Error::other("MAX_PIPES pipes are open"));
        }
        match rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK) {
            Ok((read, write)) => Ok(Self {
                read,
                write,
                held: 0,
            }),
            Err(error) => {
                OPEN.fetch_sub(1, Ordering::Relaxed);
                Err(error.into())
            }
        }
    }

    /// An empty pipe: one this thread kept, or a new one.
    pub fn take() -> io::Result<Self> {
        KEPT.with_borrow_mut(Vec::pop).map_or_else(Self::new, Ok)
    }

    /// Done with: kept for the thread's next answer if it is empty, closed if not
    /// (what it holds belongs to an answer that was cut). Kept only while fewer than
    /// half of [`MAX_PIPES`] are open, so that the threads' idle pipes (eight on
    /// each of many cores) never leave a streaming answer without one.
    pub fn give_back(self) {
        if self.held == 0 && OPEN.load(Ordering::Relaxed) <= MAX_PIPES / 2 {
            KEPT.with_borrow_mut(|kept| {
                if kept.len() < KEEP {
                    kept.push(self);
                }
            });
        }
    }

    /// Bytes in the pipe, not yet moved out.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Moves up to `max` bytes that `from` has to read into the (empty) pipe,
    /// waiting until it has some: `Ok(0)` when its peer closed.
    pub fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        from: &TcpStream,
        max: usize,
    ) -> Poll<io::Result<usize>> {
        if self.held > 0 {
            // Its EAGAIN could be the pipe's, and would be taken for the socket's.
            return Poll::Ready(Err(io::Error::other("a pipe is filled only when empty")));
        }
        let moved = ready!(poll_splice(cx, from, Interest::READABLE, || {
            rustix::pipe::splice(from, None, &self.write, None, max, SpliceFlags::NONBLOCK)
        }))?;
        self.held += moved;
        Poll::Ready(Ok(moved))
    }

    /// Moves what the pipe holds into `to`, as much as its send buffer takes,
    /// waiting until it takes some.
    pub fn poll_drain(&mut self, cx: &mut Context<'_>, to: &TcpStream) -> Poll<io::Result<usize>> {
        let held = self.held;
        let moved = ready!(poll_splice(cx, to, Interest::WRITABLE, || {
            rustix::pipe::splice(&self.read, None, to, None, held, SpliceFlags::NONBLOCK)
        }))?;
        if moved == 0 && held > 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        self.held -= moved;
        Poll::Ready(Ok(moved))
    }
}

/// Counts one more in `open` if that keeps it at most `max`.
fn take_place(open: &AtomicUsize, max: usize) -> bool {
    open.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
        (now < max).then_some(now + 1)
    })
    .is_ok()
}

impl Drop for Pipe {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs `splice` once `socket` is ready for `interest`; an `EAGAIN` clears the
/// readiness and waits again.
fn poll_splice(
    cx: &mut Context<'_>,
    socket: &TcpStream,
    interest: Interest,
    mut splice: impl FnMut() -> rustix::io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        if interest.is_readable() {
            ready!(socket.poll_read_ready(cx))?;
        } else {
            ready!(socket.poll_write_ready(cx))?;
        }
        match socket.try_io(interest, || splice().map_err(io::Error::from)) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            outcome => return Poll::Ready(outcome),
        }
    }
}

/// How a node's answer body can reach the student without passing through the
/// gateway's memory: its next bytes, from the node's socket into a [`Pipe`],
/// instead of coming as frames. Every body the students' side writes implements
/// it; only a node's body (and the layers around it) ever splices, and a body that
/// does not (the defaults) simply goes as frames: nothing is lost by leaving a
/// method out. The answer's head is never here: every header is in the
/// response's `HeaderMap`.
pub(crate) trait Splice {
    /// Whether the body's next bytes can come by [`Splice::poll_splice`] now.
    fn can_splice(&self) -> bool {
        false
    }

    /// Moves up to `max` of the body's next bytes into the empty `pipe`; called
    /// only when [`Splice::can_splice`] said yes, with `max` above 0. A body that
    /// ends before its length fails rather than moving nothing.
    fn poll_splice(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &mut Pipe,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        let _ = (cx, pipe, max);
        Poll::Ready(Err("this body does not splice".into()))
    }
}

/// A body that passes its inner body's bytes on untouched in some states and
/// changes them in others (gunzips, compresses, copies them into the cache). Its
/// [`Splice`] follows from this: it splices while it passes through, never while
/// it needs the bytes, so a new wrapper of this kind cannot get it wrong.
pub(crate) trait PassThrough {
    /// The body it wraps.
    type Inner: Splice + Unpin;

    /// The body it wraps, to ask whether that can splice.
    fn inner(&self) -> &Self::Inner;

    /// The body it wraps, to splice from.
    fn inner_mut(&mut self) -> &mut Self::Inner;

    /// Whether the inner body's bytes go out as they are right now.
    fn passing(&self) -> bool;
}

impl<T: PassThrough + Unpin> Splice for T {
    fn can_splice(&self) -> bool {
        self.passing() && self.inner().can_splice()
    }

    fn poll_splice(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &mut Pipe,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        let this = self.get_mut();
        if !this.passing() {
            return Poll::Ready(Err(
                "a body whose bytes are being changed does not splice".into()
            ));
        }
        Pin::new(this.inner_mut()).poll_splice(cx, pipe, max)
    }
}

impl Splice for Full<Bytes> {}

/// The admin listener's answers.
impl Splice for axum::body::Body {}

impl<L, R> Splice for Either<L, R>
where
    L: Splice + Unpin,
    R: Splice + Unpin,
{
    fn can_splice(&self) -> bool {
        match self {
            Either::Left(left) => left.can_splice(),
            Either::Right(right) => right.can_splice(),
        }
    }

    fn poll_splice(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &mut Pipe,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        match self.get_mut() {
            Either::Left(left) => Pin::new(left).poll_splice(cx, pipe, max),
            Either::Right(right) => Pin::new(right).poll_splice(cx, pipe, max),
        }
    }
}

/// `len` bytes, every one telling where it belongs: a byte out of place or missing
/// shows in a comparison, where zeros would not.
#[cfg(test)]
pub(crate) fn patterned(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Two connected sockets on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap());
        let (near, far) = tokio::join!(near, listener.accept());
        (near.unwrap(), far.unwrap().0)
    }

    #[tokio::test]
    async fn a_body_goes_from_one_socket_to_the_other_byte_for_byte() {
        let (mut node, from) = pair().await;
        let (to, mut student) = pair().await;
        let body = patterned(1_000_000);
        let sent = body.clone();
        let sending = tokio::spawn(async move { node.write_all(&sent).await });
        let reading = tokio::spawn(async move {
            let mut got = vec![0; 1_000_000];
            student.read_exact(&mut got).await.map(|_| got)
        });
        let mut pipe = Pipe::new().unwrap();
        let mut moved = 0;
        while moved < body.len() {
            let filled = poll_fn(|cx| pipe.poll_fill(cx, &from, PIPE_FILL.min(body.len() - moved)))
                .await
                .unwrap();
            assert!(filled > 0, "the node's bytes end early");
            while pipe.held() > 0 {
                moved += poll_fn(|cx| pipe.poll_drain(cx, &to)).await.unwrap();
            }
        }
        sending.await.unwrap().unwrap();
        assert_eq!(reading.await.unwrap().unwrap(), body);
    }

    #[test]
    fn past_the_most_pipes_no_place_is_taken_until_one_is_given_back() {
        let open = AtomicUsize::new(0);
        assert!(take_place(&open, 2));
        assert!(take_place(&open, 2));
        assert!(!take_place(&open, 2));
        assert_eq!(open.load(Ordering::Relaxed), 2);
        open.fetch_sub(1, Ordering::Relaxed);
        assert!(take_place(&open, 2));
    }

    /// The pipe's read end, which names it.
    fn fd(pipe: &Pipe) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&pipe.read)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_empty_pipe_is_kept_for_the_next_answer_and_one_holding_bytes_is_not() {
        let kept = Pipe::take().unwrap();
        let named = fd(&kept);
        kept.give_back();
        let again = Pipe::take().unwrap();
        assert_eq!(fd(&again), named, "a new pipe where an empty one was kept");

        let (mut node, from) = pair().await;
        node.write_all(b"cut short").await.unwrap();
        let mut holding = again;
        poll_fn(|cx| holding.poll_fill(cx, &from, 9)).await.unwrap();
        holding.give_back();
        let fresh = Pipe::take().unwrap();
        assert_eq!(
            fresh.held(),
            0,
            "a kept pipe still held an old answer's bytes"
        );
    }

    #[tokio::test]
    async fn a_node_that_closes_fills_nothing() {
        let (node, from) = pair().await;
        drop(node);
        let mut pipe = Pipe::new().unwrap();
        let filled = poll_fn(|cx| pipe.poll_fill(cx, &from, PIPE_FILL)).await;
        assert_eq!(filled.unwrap(), 0);
        assert_eq!(pipe.held(), 0);
    }

    #[tokio::test]
    async fn a_fill_never_takes_more_than_asked() {
        let (mut node, mut from) = pair().await;
        node.write_all(b"first part|the next answer").await.unwrap();
        let (to, mut student) = pair().await;
        let mut pipe = Pipe::new().unwrap();
        let mut moved = 0;
        while moved < 11 {
            poll_fn(|cx| pipe.poll_fill(cx, &from, 11 - moved))
                .await
                .unwrap();
            while pipe.held() > 0 {
                moved += poll_fn(|cx| pipe.poll_drain(cx, &to)).await.unwrap();
            }
        }
        drop(to);
        let mut got = Vec::new();
        student.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"first part|");
        let mut rest = [0u8; 15];
        from.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"the next answer");
    }
}

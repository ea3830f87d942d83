//! The access log: one line per request, written when its response has been sent
//! (or abandoned), in the combined log format or as JSON.
//!
//! Why at the end: the bytes sent and the total time are only known then, and an
//! aborted download is exactly what an operator looks for. The line is built by the
//! response body's wrapper ([`Logged`]) as it is dropped.
//!
//! Why a thread of its own: a request must never wait for a disk. Lines go through
//! a bounded channel to one writer thread; when the disk cannot keep up the
//! newest lines are dropped and counted, never queued without bound.
//!
//! What a line never holds: a raw session id (the table's keyed hash stands in),
//! or a credential in the URL or the `Referer` ([`crate::moodle::masked`]).
//!
//! Here: the handle, and what a request leaves for its line; `layer` puts the log
//! on the students' path, `format` writes the line, `writer` is the thread that puts
//! lines on disk.

mod format;
mod layer;
mod writer;

pub use layer::{AccessLogLayer, AccessLogged, ResponseFuture};

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use http::header::{REFERER, USER_AGENT};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};

use crate::config::{AccessLogConfig, AccessLogFormat};
use crate::http::body::splice::{Pipe, Splice};
use crate::http::body::BoxError;
use format::{combined, header, json, masked_referer, request_line};
use writer::{Message, SendOrDrop};

/// The access log, cheap to clone; off when the config says so.
#[derive(Debug, Clone, Default)]
pub struct AccessLog(Option<Arc<Sink>>);

#[derive(Debug)]
struct Sink {
    lines: SyncSender<Message>,
    format: AccessLogFormat,
    reopen: Arc<AtomicBool>,
    dropped: AtomicU64,
}

impl AccessLog {
    /// Opens the log `config` names (a file is created if missing, appended to
    /// otherwise) and starts its writer thread.
    pub fn open(config: &AccessLogConfig) -> io::Result<Self> {
        let Some((lines, reopen)) = writer::start(&config.to)? else {
            return Ok(Self(None));
        };
        Ok(Self(Some(Arc::new(Sink {
            lines,
            format: config.format,
            reopen,
            dropped: AtomicU64::new(0),
        }))))
    }

    /// Whether lines are written at all.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Writes out every line queued so far, waiting at most `wait` (at shutdown,
    /// after the last request: the drain window's lines are the ones worth having).
    pub fn flush(&self, wait: Duration) {
        let Some(sink) = &self.0 else {
            return;
        };
        let (done, flushed) = mpsc::channel();
        if sink.lines.send_timeout_or_drop(Message::Flush(done)) {
            let _ = flushed.recv_timeout(wait);
        }
        let dropped = sink.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "access log lines dropped because the disk fell behind"
            );
        }
    }

    /// Reopens the file on the writer's next turn (logrotate moved it: `SIGHUP`).
    pub fn reopen(&self) {
        if let Some(sink) = &self.0 {
            sink.reopen.store(true, Ordering::Relaxed);
        }
    }

    /// What to note of `request` before it is handed on; `None` when off.
    fn begin<B>(&self, request: &Request<B>, client: IpAddr) -> Option<Begun> {
        let sink = self.0.as_ref()?;
        Some(Begun {
            started: Instant::now(),
            at: SystemTime::now(),
            client,
            request_line: request_line(request),
            referer: header(request.headers(), &REFERER).map(masked_referer),
            user_agent: header(request.headers(), &USER_AGENT).map(str::to_owned),
            abandoned: Some(sink.clone()),
        })
    }

    /// `response` with a body that writes the line when it is done.
    fn finish<B>(
        &self,
        begun: Option<Begun>,
        trail: Trail,
        response: Response<B>,
    ) -> Response<Logged<B>> {
        let status = response.status().as_u16();
        let pending = match (&self.0, begun) {
            (Some(sink), Some(begun)) => Some(Box::new(Pending {
                begun: begun.answered(),
                trail,
                status,
                bytes: 0,
                sink: sink.clone(),
            })),
            _ => None,
        };
        response.map(|body| Logged { body, pending })
    }
}

/// What the gateway adds to a line: where the request went and for whom. The
/// service that knows it puts it in the response's extensions; [`AccessLogLayer`]
/// takes it out.
#[derive(Debug, Clone, Default)]
pub struct Trail {
    /// The upstream that answered, by name; `None` when the gateway answered itself.
    pub upstream: Option<String>,
    /// From sending the request upstream to its response head.
    pub upstream_time: Option<Duration>,
    /// How long it waited in the gateway for a slot on its node (`[surge]`);
    /// `None` on a node without a cap.
    pub queue_time: Option<Duration>,
    /// The class it stood in line in (`working`, `logged_in`, `anonymous`,
    /// `newcomer`); `None` on a node without a cap.
    pub class: Option<&'static str>,
    /// Answered from the gateway's asset cache (`upstream=cache`).
    pub cached: bool,
    /// The keyed hash of the student's session (the admin API's handle).
    pub session: Option<String>,
}

/// The request's part of a line, taken before the request is forwarded.
#[derive(Debug)]
pub struct Begun {
    started: Instant,
    at: SystemTime,
    client: IpAddr,
    /// `METHOD target HTTP/x`, the target masked.
    request_line: String,
    referer: Option<String>,
    user_agent: Option<String>,
    /// Set until the request is answered: a request the client gave up on before
    /// its response head (a stream reset, a closed connection while the node was
    /// slow) is logged as nginx logs it, status 499.
    abandoned: Option<Arc<Sink>>,
}

impl Begun {
    fn answered(mut self) -> Self {
        self.abandoned = None;
        self
    }
}

/// The status nginx logs for a request whose client closed before the answer.
const CLIENT_CLOSED: u16 = 499;

impl Drop for Begun {
    fn drop(&mut self) {
        let Some(sink) = self.abandoned.take() else {
            return;
        };
        let begun = Begun {
            started: self.started,
            at: self.at,
            client: self.client,
            request_line: std::mem::take(&mut self.request_line),
            referer: self.referer.take(),
            user_agent: self.user_agent.take(),
            abandoned: None,
        };
        let trail = Trail::default();
        send(&Pending {
            begun,
            trail,
            status: CLIENT_CLOSED,
            bytes: 0,
            sink,
        });
    }
}

#[derive(Debug)]
struct Pending {
    begun: Begun,
    trail: Trail,
    status: u16,
    bytes: u64,
    sink: Arc<Sink>,
}

/// A response body that counts what it sends and logs the request when dropped.
#[derive(Debug)]
pub struct Logged<B> {
    body: B,
    pending: Option<Box<Pending>>,
}

impl<B: Body + Unpin> Body for Logged<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(pending)) = (&polled, &mut this.pending) {
            if let Some(data) = frame.data_ref() {
                pending.bytes += bytes::Buf::remaining(data) as u64;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B: Splice + Unpin> Splice for Logged<B> {
    fn can_splice(&self) -> bool {
        self.body.can_splice()
    }

    /// Spliced bytes count when they leave the node, as a frame's do when the
    /// students' side takes it: a student who leaves mid-file is logged with up to
    /// one pipe's worth more than reached them.
    fn poll_splice(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        pipe: &mut Pipe,
        max: usize,
    ) -> Poll<Result<usize, BoxError>> {
        let this = &mut *self;
        let moved = Pin::new(&mut this.body).poll_splice(cx, pipe, max);
        if let (Poll::Ready(Ok(moved)), Some(pending)) = (&moved, &mut this.pending) {
            pending.bytes += *moved as u64;
        }
        moved
    }
}

impl<B> Drop for Logged<B> {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            send(&pending);
        }
    }
}

/// Formats one line and queues it, counting it as dropped when the queue is full.
fn send(pending: &Pending) {
    let line = match pending.sink.format {
        AccessLogFormat::Combined => combined(pending),
        AccessLogFormat::Json => json(pending),
    };
    match pending.sink.lines.try_send(Message::Line(line)) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            pending.sink.dropped.fetch_add(1, Ordering::Relaxed);
        }
        Err(TrySendError::Disconnected(_)) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::AccessLogTo;

    pub(super) fn file_log(name: &str) -> (AccessLog, PathBuf) {
        let path = std::env::temp_dir().join(format!("mg-unit-{name}-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let config = AccessLogConfig {
            to: AccessLogTo::File(path.clone()),
            format: AccessLogFormat::Combined,
        };
        (AccessLog::open(&config).expect("a writable temp dir"), path)
    }

    #[test]
    fn a_request_given_up_before_its_answer_is_logged_as_499_and_an_answered_one_once() {
        let (log, path) = file_log("abandoned");
        let request = Request::get("/course/view.php?id=2&sesskey=s3cret")
            .body(())
            .unwrap();
        drop(log.begin(&request, "192.0.2.9".parse().unwrap()));
        let begun = log.begin(&request, "192.0.2.9".parse().unwrap());
        let response = log.finish(begun, Trail::default(), Response::new(()));
        drop(response);
        log.flush(Duration::from_secs(5));
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].contains("\"GET /course/view.php?id=2&sesskey=*** HTTP/1.1\" 499 0 "),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("HTTP/1.1\" 200 0 "), "{}", lines[1]);
    }
}

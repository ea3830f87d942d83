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

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::header::{REFERER, USER_AGENT};
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};

use crate::config::{AccessLogConfig, AccessLogFormat, AccessLogTo};
use crate::moodle;

/// Lines waiting for the writer: about a second of a busy site's traffic.
const QUEUE: usize = 16 * 1024;
/// How long the writer keeps lines in its buffer when traffic is light.
const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// What the writer thread is sent.
#[derive(Debug)]
enum Message {
    /// One line, newline included.
    Line(String),
    /// Write out everything before this, then answer.
    Flush(mpsc::Sender<()>),
}

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
        let out = match &config.to {
            AccessLogTo::Off => return Ok(Self(None)),
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
    pub fn begin<B>(&self, request: &Request<B>, client: IpAddr) -> Option<Begun> {
        let sink = self.0.as_ref()?;
        Some(Begun {
            started: Instant::now(),
            at: SystemTime::now(),
            client,
            request_line: request_line(request),
            referer: header(request.headers(), REFERER).map(masked_referer),
            user_agent: header(request.headers(), USER_AGENT).map(str::to_owned),
            abandoned: Some(sink.clone()),
        })
    }

    /// `response` with a body that writes the line when it is done.
    pub fn finish<B>(
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

/// What the gateway adds to a line: where the request went and for whom.
#[derive(Debug, Clone, Default)]
pub struct Trail {
    /// The upstream that answered, by name; `None` when the gateway answered itself.
    pub upstream: Option<String>,
    /// From sending the request upstream to its response head.
    pub upstream_time: Option<Duration>,
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

/// The combined log format, then the gateway's own fields as `key=value`:
/// `1.2.3.4 - - [01/Dec/2026:12:00:00 +0000] "GET / HTTP/1.1" 200 512 "-" "curl/8"
/// upstream=web1 upstream_time=0.004 request_time=0.005 session=1f…`.
fn combined(p: &Pending) -> String {
    let b = &p.begun;
    let quoted = |v: &Option<String>| v.as_deref().map_or_else(|| "-".into(), escape);
    let mut line = format!(
        "{} - - [{}] \"{}\" {} {} \"{}\" \"{}\"",
        b.client,
        clf_time(b.at),
        escape(&b.request_line),
        p.status,
        p.bytes,
        quoted(&b.referer),
        quoted(&b.user_agent),
    );
    let t = &p.trail;
    let _ = write!(line, " upstream={}", t.upstream.as_deref().unwrap_or("-"));
    match t.upstream_time {
        Some(time) => write!(line, " upstream_time={:.3}", time.as_secs_f64()),
        None => write!(line, " upstream_time=-"),
    }
    .ok();
    let elapsed = b.started.elapsed().as_secs_f64();
    let _ = write!(line, " request_time={elapsed:.3}");
    let _ = writeln!(line, " session={}", t.session.as_deref().unwrap_or("-"));
    line
}

fn json(p: &Pending) -> String {
    let b = &p.begun;
    let t = &p.trail;
    let mut line = serde_json::json!({
        "time": humantime::format_rfc3339_millis(b.at).to_string(),
        "client": b.client.to_string(),
        "request": b.request_line,
        "status": p.status,
        "bytes": p.bytes,
        "referer": b.referer,
        "user_agent": b.user_agent,
        "upstream": t.upstream,
        "upstream_time": t.upstream_time.map(|d| d.as_secs_f64()),
        "request_time": b.started.elapsed().as_secs_f64(),
        "session": t.session,
    })
    .to_string();
    line.push('\n');
    line
}

fn request_line<B>(request: &Request<B>) -> String {
    let version = match request.version() {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    };
    let target = moodle::masked(request.uri());
    format!("{} {target} {version}", request.method())
}

fn header(headers: &HeaderMap, name: http::header::HeaderName) -> Option<&str> {
    headers.get(name)?.to_str().ok()
}

/// A `Referer` is a URL of the site, so it carries the same credentials.
fn masked_referer(referer: &str) -> String {
    let Ok(uri) = referer.parse::<http::Uri>() else {
        return "-".into();
    };
    let origin = match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(authority)) => format!("{scheme}://{authority}"),
        _ => String::new(),
    };
    format!("{origin}{}", moodle::masked(&uri))
}

/// A value inside double quotes: `"` and `\` escaped, control bytes as `\xHH`,
/// so one line stays one line whatever a client sent.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// `01/Dec/2026:12:00:00 +0000`, in UTC.
fn clf_time(at: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (year, month, day) = civil_from_days(secs / 86_400);
    let (h, m, s) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let month = MONTHS[month as usize - 1];
    format!("{day:02}/{month}/{year}:{h:02}:{m:02}:{s:02} +0000")
}

/// Days since 1970-01-01 to (year, month, day): Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// A bounded channel's send that gives up when the queue stays full.
trait SendOrDrop {
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
            tracing::warn!("cannot write the access log: {error}");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_written_as_the_combined_format_does() {
        let at = UNIX_EPOCH + Duration::from_secs(1_796_083_200 + 3_723);
        assert_eq!(clf_time(at), "01/Dec/2026:01:02:03 +0000");
        assert_eq!(clf_time(UNIX_EPOCH), "01/Jan/1970:00:00:00 +0000");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(clf_time(leap), "29/Feb/2000:00:00:00 +0000");
    }

    fn file_log(name: &str) -> (AccessLog, PathBuf) {
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

    #[test]
    fn a_hostile_header_cannot_break_the_line() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\x0ad");
    }

    #[test]
    fn a_referer_keeps_its_origin_and_loses_its_credentials() {
        assert_eq!(
            masked_referer("https://moodle.example.edu/mod/scorm/player.php?a=1&sesskey=abc"),
            "https://moodle.example.edu/mod/scorm/player.php?a=1&sesskey=***"
        );
        assert_eq!(masked_referer("not a url"), "-");
    }
}

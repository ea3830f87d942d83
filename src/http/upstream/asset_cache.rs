//! The gateway's memory of answers that can never change: bounded by bytes, least
//! recently used out first, filled once per URL however many ask at the same moment,
//! and answered as a web server answers a file it has (200 with `Age`, 304 to a
//! matching condition, HEAD).
//!
//! What may be kept is decided twice: the gateway asks only for URLs whose bytes
//! cannot change (Moodle's revisioned assets, see `moodle::revisions`), and this
//! module keeps an answer only if it says so itself: `200`, `Cache-Control: public`
//! with a `max-age`, none of `private`, `no-store` or `no-cache`, no `Set-Cookie`, a
//! `Vary` of at most `Accept-Encoding`, and a body that arrived whole within the
//! largest entry. Anything else passes through untouched and is not kept.
//!
//! What an entry keeps of the node's answer: every header line but the hop-by-hop
//! ones (RFC 9110 7.6.1: `Connection` and the lines it names, `Keep-Alive`,
//! `Transfer-Encoding`, `TE`, `Trailer`, `Upgrade`, `Proxy-*`) and those a hit
//! writes afresh (`Content-Length`, `Age`, `Date`), as RFC 9111 3.1 stores a
//! response: `X-Content-Type-Options`, CORS, CSP, `Strict-Transport-Security`,
//! `Accept-Ranges` and any header of the site's own reach every browser as they
//! reached the first. (`Set-Cookie` never: an answer with one is not kept.)
//!
//! One copy per URL, whatever the browser sent: the request that fills an entry
//! asks the node in gzip only ([`Fill::ask`]), so Moodle's PHP compresses its CSS
//! and JavaScript once and the entry keeps that gzip copy (the entry bound applies
//! to it: Moodle's 3.2 MB `first.js` is kept as its 650 KB of gzip). A browser that
//! takes gzip gets the copy as it is; one that does not gets it gunzipped as it
//! streams ([`Inflated`]), and the compression layer above may give it brotli from
//! there. So a revisioned asset costs PHP one run whatever the clients send, and
//! Chrome's, Firefox's and curl's `Accept-Encoding` share one entry (see [`coding`]
//! for why the node's own rule could not be trusted with the browser's line).
//!
//! Why one mutex: lookups happen only for revisioned assets, never for a student's
//! page, and each holds the lock for a hash lookup and a recency bump. An entry is an
//! `Arc` handed out under the lock and served outside it; its body is a `Bytes` that
//! every hit shares.
//!
//! Why waiters ask the node themselves when a fill fails: the answer that could not
//! be kept (a `Set-Cookie`, a `private`, a cut-short body) is exactly one that must
//! not be copied to another student, so each gets its own from the node.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{Either, Full};
use tokio::sync::watch;

use crate::http::body::inflate::{gunzipped_headers, is_gzip, weaken_etag, Inflated};
use crate::http::body::splice::{PassThrough, Splice};
use crate::http::h1::wire::names_lines;

mod coding;

pub use coding::{Coding, Wants};

/// The headers an entry does not keep: hop-by-hop (RFC 9110 7.6.1; `Proxy-*` by
/// [`kept`]), and those a hit writes itself.
const NOT_KEPT: [HeaderName; 9] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::CONTENT_LENGTH,
    header::AGE,
    header::DATE,
    header::SET_COOKIE,
];

/// Whether an entry keeps a header line named `name` of an answer whose
/// `Connection` lines are `connection`.
fn kept(name: &HeaderName, connection: &[&HeaderValue]) -> bool {
    let name = name.as_str();
    !(NOT_KEPT.iter().any(|not| not.as_str() == name)
        || name == "keep-alive"
        || name.starts_with("proxy-")
        || connection.iter().any(|value| {
            (value.as_bytes().split(|&b| b == b','))
                .any(|token| token.trim_ascii().eq_ignore_ascii_case(name.as_bytes()))
        }))
}

/// Of those, what a 304 repeats (RFC 9110 15.4.5).
const ON_304: [HeaderName; 5] = [
    header::ETAG,
    header::CACHE_CONTROL,
    header::EXPIRES,
    header::LAST_MODIFIED,
    header::VARY,
];

/// One kept answer.
#[derive(Debug)]
pub struct Entry {
    headers: HeaderMap,
    body: Bytes,
    stored: Instant,
    /// The coding the node answers requests like the one it was filled for, when
    /// the answer varies on `Accept-Encoding`.
    variant: Option<Coding>,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// The answer, from memory.
    Hit(Arc<Entry>),
    /// Nobody has it: this request fills it (keep the [`Fill`] with the response).
    Fill(Fill),
    /// Another request is filling it: wait for that, then look again as
    /// [`Role::Waited`].
    Wait(watch::Receiver<bool>),
    /// Not here, and this request neither fills nor waits: ask the node.
    Pass,
}

/// What a request may do on a miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The first look of a `GET`: fill, or wait for the request filling it.
    First,
    /// A `GET` that waited for a fill that kept nothing: fill if nobody does, never
    /// wait twice (an answer that could not be kept must not line everyone up).
    Waited,
    /// A `HEAD`: a hit or the node; it has no body to fill with.
    Head,
}

/// The cache's figures, for `/metrics`, the admin API and the dashboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheNow {
    /// Kept answers (every `Accept-Encoding` variant counts).
    pub entries: usize,
    /// Their bodies' bytes.
    pub bytes: u64,
    /// Answers from memory since the start.
    pub hits: u64,
    /// Revisioned requests that had to ask a node.
    pub misses: u64,
    /// Answers kept.
    pub fills: u64,
    /// Entries let go to make room.
    pub evictions: u64,
}

/// The bounded store.
#[derive(Debug)]
pub struct AssetCache {
    max_bytes: u64,
    max_entry: u64,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
    fills: AtomicU64,
    evictions: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    /// By URL key: the variants kept, and the URL's place in the recency order.
    urls: HashMap<Arc<str>, Url>,
    /// Least recently used first; the keys are the map's own, shared.
    order: BTreeMap<u64, Arc<str>>,
    tick: u64,
    bytes: u64,
    entries: usize,
    /// URLs being filled, with the channel their waiters watch.
    filling: HashMap<String, watch::Sender<bool>>,
}

/// One URL's kept variants.
#[derive(Debug)]
struct Url {
    /// Its key, shared with the recency order: a hit moves it without allocating.
    key: Arc<str>,
    variants: Vec<Arc<Entry>>,
    /// Its place in the recency order.
    at: u64,
}

impl AssetCache {
    /// A cache of at most `max_bytes` in all and `max_entry` per answer.
    pub fn new(max_bytes: u64, max_entry: u64) -> Arc<Self> {
        Arc::new(Self {
            max_bytes,
            max_entry: max_entry.min(max_bytes),
            inner: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            fills: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        })
    }

    /// The answer for `key` (host, path and query) to a request with the
    /// `Accept-Encoding` `wants`, or who fills it.
    pub fn lookup(self: &Arc<Self>, key: &str, wants: &Wants, role: Role) -> Lookup {
        // Every fill asks the node in gzip: one variant, whatever this request says.
        let node_coding = Coding::Gzip;
        let mut inner = self.lock();
        let tick = inner.tick + 1;
        let mut refused = false;
        let found = inner.urls.get_mut(key).and_then(|url| {
            let entry = url.variants.iter().find(|e| e.serves(node_coding))?;
            // A coding the browser does not accept and the gateway cannot undo (a
            // node that answered `deflate` or `br` to a request for gzip).
            refused = !entry.servable_to(wants);
            if refused {
                return None;
            }
            let was = std::mem::replace(&mut url.at, tick);
            Some((entry.clone(), url.key.clone(), was))
        });
        if let Some((entry, key, was)) = found {
            inner.tick = tick;
            inner.order.remove(&was);
            inner.order.insert(tick, key);
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Lookup::Hit(entry);
        }
        // A miss is a request that goes to a node; a wait that ends in a hit is a hit.
        // A refused coding neither fills nor waits: the fill would be the same answer.
        let role = if refused { Role::Head } else { role };
        match (inner.filling.get(key), role) {
            (Some(filling), Role::First) => return Lookup::Wait(filling.subscribe()),
            (_, Role::Head) | (Some(_), Role::Waited) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                return Lookup::Pass;
            }
            (None, _) => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        let (done, _) = watch::channel(false);
        inner.filling.insert(key.to_owned(), done);
        Lookup::Fill(Fill {
            cache: self.clone(),
            key: key.to_owned(),
            coding: node_coding,
            gunzip: !wants.accepts(Some(b"gzip")),
            finished: false,
        })
    }

    /// The bound on all entries' bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Forgets every entry (after a Moodle upgrade or a theme change made without a
    /// cache purge); returns how many there were.
    pub fn purge(&self) -> usize {
        let mut inner = self.lock();
        let entries = inner.entries;
        (inner.urls, inner.order) = Default::default();
        (inner.bytes, inner.entries) = (0, 0);
        entries
    }

    /// The figures now.
    pub fn now(&self) -> CacheNow {
        let inner = self.lock();
        CacheNow {
            entries: inner.entries,
            bytes: inner.bytes,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            fills: self.fills.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    fn insert(&self, key: &str, entry: Entry) {
        let size = entry.body.len() as u64;
        let mut inner = self.lock();
        let tick = inner.tick + 1;
        inner.tick = tick;
        let key: Arc<str> = Arc::from(key);
        let url = inner.urls.entry(key.clone()).or_insert_with(|| Url {
            key,
            variants: Vec::new(),
            at: 0,
        });
        let (same, others): (Vec<_>, Vec<_>) =
            (url.variants.drain(..)).partition(|e| e.variant == entry.variant);
        url.variants = others;
        url.variants.push(Arc::new(entry));
        let was = std::mem::replace(&mut url.at, tick);
        let key = url.key.clone();
        let replaced: u64 = same.iter().map(|e| e.body.len() as u64).sum();
        inner.order.remove(&was);
        inner.order.insert(tick, key);
        inner.bytes = inner.bytes - replaced + size;
        inner.entries = inner.entries + 1 - same.len();
        while inner.bytes > self.max_bytes {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some(Url { variants, .. }) = inner.urls.remove(&oldest) {
                inner.bytes -= variants.iter().map(|e| e.body.len() as u64).sum::<u64>();
                inner.entries -= variants.len();
                self.evictions
                    .fetch_add(variants.len() as u64, Ordering::Relaxed);
            }
        }
        self.fills.fetch_add(1, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Entry {
    /// Whether it is the node's answer to a request it answers in `coding`.
    fn serves(&self, coding: Coding) -> bool {
        self.variant.is_none_or(|v| v == coding)
    }

    /// Whether its coding is one the browser accepts.
    fn accepted_by(&self, wants: &Wants) -> bool {
        (self.headers.get_all(header::CONTENT_ENCODING).iter())
            .map(|value| Some(value.as_bytes()))
            .chain([None])
            .all(|coding| wants.accepts(coding))
    }

    /// Whether it can go to the browser: as it is, or gunzipped.
    fn servable_to(&self, wants: &Wants) -> bool {
        self.accepted_by(wants) || (is_gzip(&self.headers) && wants.accepts(None))
    }

    /// [`Entry::answer`] in a coding the browser accepts: the gzip copy gunzipped as
    /// it streams for a browser that does not take gzip.
    pub fn answer_for(
        &self,
        method: &Method,
        request: &HeaderMap,
        wants: &Wants,
    ) -> Response<Either<Full<Bytes>, Inflated<Full<Bytes>>>> {
        let answer = self.answer(method, request);
        if self.accepted_by(wants) || !is_gzip(&self.headers) {
            return answer.map(Either::Left);
        }
        let (mut parts, body) = answer.into_parts();
        if parts.status == StatusCode::NOT_MODIFIED {
            weaken_etag(&mut parts.headers);
            return Response::from_parts(parts, Either::Left(body));
        }
        gunzipped_headers(&mut parts.headers);
        let body = match *method == Method::HEAD {
            true => Either::Left(body),
            false => Either::Right(Inflated::gunzip(body)),
        };
        Response::from_parts(parts, body)
    }

    /// The answer to a `GET` or `HEAD` with `request` headers: 304 when its
    /// `If-None-Match` names the entry's ETag (or, without one, its
    /// `If-Modified-Since` is the entry's `Last-Modified`, as nginx's `exact`), else 200
    /// with the stored headers, the bytes (none for HEAD) and an `Age`.
    pub fn answer(&self, method: &Method, request: &HeaderMap) -> Response<Full<Bytes>> {
        let age = HeaderValue::from(self.stored.elapsed().as_secs());
        if self.not_modified(request) {
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = StatusCode::NOT_MODIFIED;
            let headers = response.headers_mut();
            for name in ON_304 {
                if let Some(value) = self.headers.get(&name) {
                    headers.insert(name, value.clone());
                }
            }
            headers.insert(header::AGE, age);
            return response;
        }
        let body = if *method == Method::HEAD {
            Bytes::new()
        } else {
            self.body.clone()
        };
        let mut response = Response::new(Full::new(body));
        let headers = response.headers_mut();
        headers.clone_from(&self.headers);
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(self.body.len()));
        headers.insert(header::AGE, age);
        response
    }

    fn not_modified(&self, request: &HeaderMap) -> bool {
        if let Some(wanted) = request.get(header::IF_NONE_MATCH) {
            let Some(etag) = self.headers.get(header::ETAG) else {
                return false;
            };
            return etag_listed(wanted.as_bytes(), etag.as_bytes());
        }
        let since = request.get(header::IF_MODIFIED_SINCE);
        since.is_some_and(|since| self.headers.get(header::LAST_MODIFIED) == Some(since))
    }
}

/// Whether an `If-None-Match` list names `etag` by the weak comparison (or is `*`).
fn etag_listed(list: &[u8], etag: &[u8]) -> bool {
    let opaque =
        |tag: &[u8]| -> Vec<u8> { tag.strip_prefix(b"W/").unwrap_or(tag).trim_ascii().to_vec() };
    let etag = opaque(etag);
    list.split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .any(|tag| tag == b"*" || opaque(tag) == etag)
}

/// The right to fill one URL, held by the request that missed first. Dropped
/// without a kept answer, it tells the waiters to ask the node themselves.
#[derive(Debug)]
pub struct Fill {
    cache: Arc<AssetCache>,
    key: String,
    /// The coding the node answers the filling request in.
    coding: Coding,
    /// Whether the filling request's browser takes no gzip.
    gunzip: bool,
    finished: bool,
}

impl Fill {
    /// The filling request as the node will see it: asking for gzip, and nothing
    /// else, so that the one copy kept is the one any browser can be answered from.
    pub fn ask(&self, request: &mut HeaderMap) {
        request.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
    }

    /// The node's answer to a request [`Fill::ask`] changed, for a browser that
    /// takes no gzip: gunzipped as it streams when it came in gzip.
    fn for_browser<B>(gunzip: bool, response: Response<Teed<B>>) -> Response<Inflated<Teed<B>>> {
        let (mut parts, body) = response.into_parts();
        if !(gunzip && is_gzip(&parts.headers)) {
            return Response::from_parts(parts, Inflated::plain(body));
        }
        gunzipped_headers(&mut parts.headers);
        Response::from_parts(parts, Inflated::gunzip(body))
    }

    /// The node's answer, read for the cache as it streams to the student when it may
    /// be kept; otherwise the answer as it is (and the fill given up).
    pub fn keep<B>(self, response: Response<B>) -> Response<Inflated<Teed<B>>> {
        let gunzip = self.gunzip;
        Self::for_browser(gunzip, self.tee(response))
    }

    /// The node's answer, teed into the entry when it may be kept.
    fn tee<B>(self, response: Response<B>) -> Response<Teed<B>> {
        let (parts, body) = response.into_parts();
        let limit = self.cache.max_entry;
        let length = parts.headers.get(header::CONTENT_LENGTH);
        let length = length.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let fits = length.is_none_or(|n| n <= limit);
        let Some(encoding) = keepable(parts.status, &parts.headers).filter(|_| fits) else {
            return Response::from_parts(parts, Teed::plain(body));
        };
        // Copied, not shared: a node's header values are slices of the buffer its
        // answer was read into (16 KiB), which a kept entry would otherwise hold.
        let mut headers = HeaderMap::with_capacity(parts.headers.keys_len());
        let connection: Vec<&HeaderValue> = (parts.headers.get_all(header::CONNECTION).iter())
            .filter(|value| names_lines(value.as_bytes()))
            .collect();
        for (name, value) in &parts.headers {
            if kept(name, &connection) {
                let mut copy =
                    HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
                copy.set_sensitive(value.is_sensitive());
                headers.append(name.clone(), copy);
            }
        }
        let fill = Filling {
            variant: encoding.then_some(self.coding),
            fill: self,
            headers,
            collected: BytesMut::new(),
            length,
        };
        Response::from_parts(
            parts,
            Teed {
                inner: body,
                filling: Some(Box::new(fill)),
            },
        )
    }

    fn finish(&mut self, entry: Option<Entry>) {
        self.finished = true;
        if let Some(entry) = entry {
            self.cache.insert(&self.key, entry);
        }
        let done = self.cache.lock().filling.remove(&self.key);
        if let Some(done) = done {
            done.send_replace(true);
        }
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        if !self.finished {
            self.finish(None);
        }
    }
}

/// Whether a node's answer says it may be kept: `Some(varies on Accept-Encoding)`.
fn keepable(status: StatusCode, headers: &HeaderMap) -> Option<bool> {
    if status != StatusCode::OK || headers.contains_key(header::SET_COOKIE) {
        return None;
    }
    let mut public = false;
    let mut max_age = false;
    for directive in (headers.get_all(header::CACHE_CONTROL).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|d| d.trim().to_ascii_lowercase())
    {
        match directive.split('=').next().unwrap_or("") {
            "public" => public = true,
            "max-age" | "s-maxage" => max_age = true,
            "private" | "no-store" | "no-cache" => return None,
            _ => {}
        }
    }
    if !(public && max_age) {
        return None;
    }
    let mut encoding = false;
    for field in (headers.get_all(header::VARY).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|f| !f.is_empty())
    {
        if field.eq_ignore_ascii_case("accept-encoding") {
            encoding = true
        } else {
            return None;
        }
    }
    Some(encoding)
}

/// A fill in progress: the headers to keep and the bytes so far.
#[derive(Debug)]
struct Filling {
    fill: Fill,
    variant: Option<Coding>,
    headers: HeaderMap,
    collected: BytesMut,
    /// The `Content-Length`, when the node sent one: hyper stops polling a body
    /// that has sent that much, so its end is known from the count.
    length: Option<u64>,
}

impl Filling {
    /// The whole body is here: keep it.
    fn kept(self) {
        let Filling {
            mut fill,
            variant,
            headers,
            collected,
            ..
        } = self;
        let entry = Entry {
            headers,
            body: collected.freeze(),
            stored: Instant::now(),
            variant,
        };
        fill.finish(Some(entry));
    }
}

/// A response body on its way to the student, copied into the cache as it passes
/// when it is filling one (`filling`); otherwise exactly the body it wraps.
#[derive(Debug)]
pub struct Teed<B> {
    inner: B,
    filling: Option<Box<Filling>>,
}

impl<B> Teed<B> {
    /// `inner`, passed through.
    pub fn plain(inner: B) -> Self {
        Self {
            inner,
            filling: None,
        }
    }
}

impl<B> Body for Teed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        let Some(filling) = &mut this.filling else {
            return frame;
        };
        match &frame {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let limit = filling.fill.cache.max_entry as usize;
                    if filling.collected.len() + data.len() > limit {
                        // Larger than the largest entry: streamed on, not kept.
                        this.filling = None;
                    } else {
                        filling.collected.extend_from_slice(data);
                        let whole = Some(filling.collected.len() as u64) == filling.length;
                        if whole {
                            if let Some(filling) = this.filling.take() {
                                (*filling).kept();
                            }
                        }
                    }
                }
            }
            Poll::Ready(None) => {
                // A body with a length is kept only if all of it came.
                let filling = this.filling.take();
                let whole = filling
                    .as_ref()
                    .is_some_and(|f| f.length.is_none_or(|n| n == f.collected.len() as u64));
                if let Some(filling) = filling.filter(|_| whole) {
                    (*filling).kept();
                }
            }
            // An error or a body cut short: nothing kept (the fill drops).
            Poll::Ready(Some(Err(_))) => this.filling = None,
            Poll::Pending => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        // A body that ends without a last poll would never be kept: report the end
        // only when nothing is being filled.
        self.filling.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Splice + Unpin> PassThrough for Teed<B> {
    type Inner = B;

    fn inner(&self) -> &B {
        &self.inner
    }

    fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Not while the body is being copied into the cache: the copy needs its bytes.
    fn passing(&self) -> bool {
        self.filling.is_none()
    }
}

/// How long a waiter waits for another request's fill before asking the node itself.
pub const FILL_WAIT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests;

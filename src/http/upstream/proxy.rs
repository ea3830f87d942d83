//! Forwarding one request to one upstream: URI rewrite, header hygiene, the pooled
//! client, streaming bodies both ways, and mapping upstream failures to statuses.
//!
//! Bodies are never collected: the client's body is handed to the node connection
//! ([`crate::http::h1::client`]) as the upstream request body and the upstream's body is
//! handed back as the response body, so a
//! 1 GiB SCORM package or upload moves through a few 16 KiB buffers at a time and
//! back-pressure flows from the slow side to the fast one.

use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, Uri};
use http::{Method, Request, Response};

use crate::error::GatewayError;
use crate::http::body::spool::Spool;
use crate::http::body::{
    is_body_idle, wraps, BodyTooLarge, ClientBodyError, IdleLimited, UploadTooLong, UploadTooSlow,
};
use crate::http::h1::client::ClientError;
use crate::http::h1::wire::names_lines;
use crate::http::upstream::fault::ConnectFault;
use crate::http::upstream::offload;
use crate::http::upstream::pool::{ConnectError, Conns, NodeBody, Pool, Reuse, SendError};
use crate::http::upstream::upload::Upload;

/// How long the parts of one exchange may take, and how large the upload may be.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// The largest request body (`limits.max_body_bytes`).
    pub max_body_bytes: u64,
    /// Opening a connection of its own to a node (upgrades).
    pub connect: Duration,
    /// The longest silence of an upgraded connection (WebSocket).
    pub tunnel_idle: Duration,
    /// From the end of the request body to the response head.
    pub response_headers: Duration,
    /// The longest pause inside a body, either way.
    pub body_idle: Duration,
    /// A request body up to this size is read whole before a node is contacted.
    pub buffer_body_bytes: u64,
    /// A larger body up to this size is kept on disk until whole (0: never).
    pub spool_body_bytes: u64,
    /// Bytes per second a streamed upload must average over each window (0: none).
    pub upload_min_rate: u64,
    /// The window `upload_min_rate` is averaged over.
    pub upload_rate_window: Duration,
    /// The longest a whole upload may take.
    pub upload: Duration,
}

/// One client connection, as the requests on it are forwarded: built once when the
/// connection is accepted, so a request does not format its peer's address again.
#[derive(Debug)]
pub struct Client {
    /// The TCP peer address.
    pub ip: IpAddr,
    /// Whether the connection is TLS (the gateway terminated it).
    pub tls: bool,
    /// `ip` as an `X-Forwarded-For` value.
    forwarded_for: HeaderValue,
    /// A request on this connection has been forwarded (see [`Peer::first`]).
    forwarded: AtomicBool,
}

impl Client {
    /// The connection from `ip`, TLS or not.
    pub fn new(ip: IpAddr, tls: bool) -> Self {
        Self {
            ip,
            tls,
            forwarded_for: ip_header_value(ip),
            forwarded: AtomicBool::new(false),
        }
    }

    /// What a request on this connection is forwarded as; `trusted` says whether
    /// the peer is one of `trusted_proxies`. The first call on a connection makes
    /// its [`Peer::first`].
    pub fn peer(&self, trusted: bool) -> Peer<'_> {
        Peer {
            ip: self.ip,
            trusted,
            tls: self.tls,
            forwarded_for: &self.forwarded_for,
            first: !self.forwarded.swap(true, Ordering::Relaxed),
        }
    }
}

/// What the gateway knows about the client side of a request.
#[derive(Debug, Clone, Copy)]
pub struct Peer<'a> {
    /// The TCP peer address.
    pub ip: IpAddr,
    /// Whether that peer is a trusted proxy whose `X-Forwarded-*` headers are kept.
    pub trusted: bool,
    /// Whether the student's connection is TLS (the gateway terminated it).
    pub tls: bool,
    /// `ip` as a header value.
    forwarded_for: &'a HeaderValue,
    /// The connection's first request on its way to a node: it takes only a
    /// quiet kept node connection ([`Reuse::Quiet`]).
    pub first: bool,
}

impl Peer<'_> {
    /// Which kept node connections the request may take: a student's first
    /// request only a quiet one (see [`crate::http::upstream::pool`]).
    pub fn reuse(&self) -> Reuse {
        if self.first {
            Reuse::Quiet
        } else {
            Reuse::Any
        }
    }
}

/// Whether the student reached the public side over HTTPS, as far as the gateway can
/// tell: a trusted proxy in front said so.
pub fn is_https(headers: &HeaderMap, peer: Peer<'_>) -> bool {
    peer.tls
        || peer.trusted
            && headers
                .get(&X_FORWARDED_PROTO)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"))
}

/// `request` as it goes to `upstream`: origin-form target, HTTP/1.1 whatever the
/// student spoke (an HTTP/2 request's host is already in its Host header, its cookie
/// crumbs are joined here), and the header hygiene of `prepare_request_headers`.
pub fn prepare<B>(upstream: &Authority, request: &mut Request<B>, peer: Peer<'_>) {
    if request.uri().authority().is_some() {
        *request.uri_mut() = origin_form(request.uri());
    }
    *request.version_mut() = http::Version::HTTP_11;
    prepare_request_headers(request.headers_mut(), peer, upstream)
}

/// A request that failed, with the request itself when it may go again: none of it
/// left (its node could not even be connected to), or it is a GET or HEAD whose node
/// closed the connection before a byte of its answer. The caller may send it to
/// another node, or again.
#[derive(Debug)]
pub struct Failed {
    /// What the student sees if the request goes nowhere else.
    pub error: GatewayError,
    /// The request as it was handed to [`forward`], its body perhaps read into
    /// memory, none of it sent to any node: as the student sent it, or, once it was
    /// sent and came back to be replayed ([`HopByHop::Done`]), as it was sent. With
    /// `replay`, the request as it was sent.
    pub unsent: Option<Request<Upload>>,
    /// The node refused (or reset) the connection: nothing listens there right now,
    /// as while its web server restarts. Only ever set with `unsent`.
    pub refused: bool,
    /// The request did reach the node, which closed the connection without a byte of
    /// answer (PHP-FPM restarted or crashed, the node rebooted): `unsent` is the GET
    /// or HEAD without a body that was sent, which RFC 9110 (9.2.2) lets a proxy
    /// repeat, as HAProxy's `retry-on empty-response` does. Only ever set with
    /// `unsent`.
    pub replay: bool,
}

impl From<GatewayError> for Failed {
    fn from(error: GatewayError) -> Self {
        Self {
            error,
            unsent: None,
            refused: false,
            replay: false,
        }
    }
}

/// Whether a request still needs the proxy's hop-by-hop work ([`prepare`]: its
/// hop-by-hop headers stripped, this hop added to `X-Forwarded-*`) on its way to a
/// node. A request that went once and comes back to be replayed has had it: a
/// second pass would add the gateway's hop to a trusted proxy's
/// `X-Forwarded-For` twice. (Its `Host`, if an HTTP/1.0 student sent none, stays
/// the first node's.)
#[derive(Debug, Clone, Copy)]
pub enum HopByHop<'a> {
    /// The request is as the student sent it; this is who sent it.
    Due(Peer<'a>),
    /// The request was prepared for a node before.
    Done,
}

/// The upstream a request goes to, as this wing sees one: the name the logs call
/// it by (an operator knows `web3`, not `10.0.0.13:80`), its address, and its
/// kept connections.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The upstream's name in the config.
    pub name: &'a str,
    /// Where it listens.
    pub authority: &'a Authority,
    /// Its kept connections.
    pub conns: &'a Arc<Conns>,
}

/// The status for a connect that failed, logged as whose fault it is: the gateway's
/// own lack of resources is never reported as the node's.
fn connect_failed(upstream: &str, error: &ConnectError) -> ConnectFault {
    let fault = error.fault();
    match fault {
        ConnectFault::Gateway => tracing::warn!(
            upstream = %upstream,
            "the gateway is out of connections (its own limit, not the upstream's fault): {error}"
        ),
        ConnectFault::Refused | ConnectFault::Upstream => {
            tracing::warn!(upstream = %upstream, "upstream unreachable: {error}")
        }
    }
    fault
}

/// Sends `request` (its body, if any) to the node at `authority`, over one of its
/// kept connections `conns` or a new one, and returns its streaming response, or the
/// error a student should see. Never sent to another node here: once bytes left for
/// one node, another node must not see the same POST.
///
/// A small body is read whole before any node is contacted (see
/// [`crate::http::upstream::upload`]): a slow student then never holds a PHP worker. A
/// caller that spools reads the body with [`read_ahead`] first.
///
/// Not an `async fn`: one keeps each argument twice (as it came and as a local),
/// and this future is kept inside every request's; the block below moves
/// `request` once, and the header hygiene changes it in place.
#[allow(clippy::manual_async_fn)]
pub fn forward<'a>(
    pool: &'a Pool,
    target: Target<'a>,
    mut request: Request<Upload>,
    hop_by_hop: HopByHop<'a>,
    bounds: Bounds,
    reuse: Reuse,
) -> impl Future<Output = Result<Response<IdleLimited<NodeBody>>, Failed>> + 'a {
    async move {
        let Target {
            name,
            authority,
            conns,
        } = target;
        read_ahead(&mut request, name, &bounds, None).await?;
        // The connection first: a request whose node cannot be reached goes back as it
        // was handed in, before any header hygiene of this try, so another node can
        // take it as is.
        let first = match pool.lease(authority, conns, reuse).await {
            Ok(lease) => lease,
            Err(error) => return Err(not_connected(name, &error, request)),
        };
        // A GET or HEAD without a body may go again if its node closes without a
        // byte of answer (see `Failed`); anything else may have changed something on
        // the node and must never run twice.
        let replayable =
            matches!(*request.method(), Method::GET | Method::HEAD) && request.body().is_empty();
        if let HopByHop::Due(peer) = hop_by_hop {
            prepare(authority, &mut request, peer);
        }
        if let Some(len) = request.body().whole_len() {
            sized(request.headers_mut(), len);
        }
        let mut request = request.map(|upload| upload.into_request_body(bounds.max_body_bytes));
        // The node has `response_headers` for its answer's head once it has the whole
        // request (the connection keeps the time: an upload slower than that is timed
        // by its own rules, not this one).
        let head_wait = bounds.response_headers;
        let mut next = first;
        let SendError {
            error, sent_head, ..
        } = loop {
            let (lease, reused) = next;
            match lease.send(request, reused, head_wait).await {
                Ok(response) => return Ok(answered(name, response, bounds.body_idle)?),
                // The node closed a kept connection as it was taken: nothing was
                // sent, so another connection carries the request. Each failed
                // kept one is dropped, and a new one is never retried.
                Err(SendError {
                    unsent: Some(unsent),
                    ..
                }) if reused => {
                    request = unsent;
                    next = match pool.lease(authority, conns, reuse).await {
                        Ok(lease) => lease,
                        Err(error) => return Err(connect_failed(name, &error).error().into()),
                    };
                }
                Err(failed) => break failed,
            }
        };
        Err(failed_after_sending(name, &error, sent_head, replayable))
    }
}

/// A request whose node could not be connected to: handed back as it came, for
/// another node.
fn not_connected(name: &str, error: &ConnectError, request: Request<Upload>) -> Failed {
    let fault = connect_failed(name, error);
    Failed {
        error: fault.error(),
        unsent: Some(request),
        refused: fault == ConnectFault::Refused,
        replay: false,
    }
}

/// Sent, and it failed. If the node closed without a byte of answer, a GET or HEAD
/// goes back to the caller to be sent again, as it was sent (see `Failed`);
/// anything else is answered as it failed (a 502, a 504 past `response_headers`,
/// the student's own upload fault).
fn failed_after_sending(
    name: &str,
    error: &ClientError,
    sent_head: Option<http::request::Parts>,
    replayable: bool,
) -> Failed {
    let seen = classify_error(name, error);
    match sent_head.filter(|_| replayable && error.closed_without_answer()) {
        Some(head) => {
            tracing::info!(upstream = %name, "closed without answering: the GET or HEAD may go again");
            Failed {
                error: seen,
                unsent: Some(Request::from_parts(head, Upload::empty())),
                refused: false,
                replay: true,
            }
        }
        None => seen.into(),
    }
}

/// The node's answer as the student gets it: hop-by-hop headers stripped, its body
/// under `body_idle`.
fn answered(
    name: &str,
    mut response: Response<NodeBody>,
    body_idle: Duration,
) -> Result<Response<IdleLimited<NodeBody>>, GatewayError> {
    // The request went without `Upgrade` (only WebSocket goes through the tunnel, on
    // a connection of its own), so a `101` here is a node switching a pooled
    // connection on its own: never passed on.
    if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        tracing::warn!(
            upstream = %name,
            "101 to a request that asked for no upgrade: refused"
        );
        return Err(GatewayError::UpstreamBroken);
    }
    strip_hop_by_hop(response.headers_mut());
    Ok(response.map(|body| IdleLimited::new(body, body_idle)))
}

/// Reads `request`'s body as far as it goes before a node is contacted: into
/// memory, onto `spool`'s disk, or not at all ([`Upload::read_ahead`]); a failure
/// is the student's, answered as its status (logged naming the node it was for).
pub async fn read_ahead(
    request: &mut Request<Upload>,
    upstream: &str,
    bounds: &Bounds,
    spool: Option<&Spool>,
) -> Result<(), GatewayError> {
    match request.body_mut().read_ahead(bounds, spool).await {
        Ok(()) => Ok(()),
        Err(error) => {
            Err(client_fault(upstream, &*error).unwrap_or(GatewayError::MalformedRequest))
        }
    }
}

/// A body read whole goes with its length: a chunked one is re-framed, and nothing
/// is left for the node to wait for (`Expect: 100-continue` is answered already).
fn sized(headers: &mut HeaderMap, len: u64) {
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    headers.remove(header::EXPECT);
}

/// What the student sees of a failed exchange with a node, logged.
fn classify_error(upstream: &str, error: &ClientError) -> GatewayError {
    if let ClientError::HeadTimeout(_) = error {
        tracing::warn!(upstream = %upstream, "{error}");
        return GatewayError::UpstreamTimeout;
    }
    client_fault(upstream, error).unwrap_or_else(|| {
        tracing::warn!(upstream = %upstream, "upstream exchange failed: {}", Causes(error));
        GatewayError::UpstreamBroken
    })
}

/// The student's share of a failed exchange, logged: its upload paused, crawled,
/// took too long, grew too large or broke. `None` when the failure is the node's.
fn client_fault(upstream: &str, error: &(dyn std::error::Error + 'static)) -> Option<GatewayError> {
    let (error, why) = if is_body_idle(error) {
        (GatewayError::ClientTimeout, "paused longer than body_idle")
    } else if wraps::<UploadTooSlow>(error) {
        (
            GatewayError::UploadTooSlow,
            "averaged less than upload_min_rate",
        )
    } else if wraps::<UploadTooLong>(error) {
        (
            GatewayError::UploadTooLong,
            "took longer than timeouts.upload",
        )
    } else if wraps::<BodyTooLarge>(error) {
        (GatewayError::PayloadTooLarge, "went over max_body_bytes")
    } else if wraps::<ClientBodyError>(error) {
        tracing::info!(
            upstream = %upstream,
            "the student's upload could not be read: {}",
            Causes(error)
        );
        return Some(GatewayError::MalformedRequest);
    } else {
        return None;
    };
    tracing::info!(upstream = %upstream, "the student's upload {why}");
    Some(error)
}

/// An error and its sources, as one line (`a: b: c`): an error's own message is
/// often only "the connection to the node failed", and the `Debug` form is not
/// meant for people.
struct Causes<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// `{path?query}` of an absolute-form target (HTTP/2's, or an HTTP/1.1 client's that
/// named the host): the path and query travel byte for byte, since the node must
/// decode them exactly as the gateway classified them.
fn origin_form(original: &Uri) -> Uri {
    let mut parts = http::uri::Parts::default();
    parts.path_and_query = Some(
        original
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
    );
    Uri::from_parts(parts).expect("a path alone is a valid URI")
}

/// Hop-by-hop headers name this connection, not the request; the ones in
/// `Connection` are hop-by-hop by declaration (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// Removes hop-by-hop headers (including `Keep-Alive`, `Proxy-*` and whatever
/// `Connection` lists) before the gateway adds its own.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Runs twice per request and usually finds nothing, or only a node's
    // `Connection: keep-alive`: one pass over the names, without hashing or
    // allocating, decides that.
    if headers.keys().any(is_hop_by_hop) {
        strip_listed_hop_by_hop(headers);
    }
}

/// Removes the hop-by-hop headers of a map known to have some.
fn strip_listed_hop_by_hop(headers: &mut HeaderMap) {
    let lists_more =
        (headers.get_all(header::CONNECTION).iter()).any(|v| names_lines(v.as_bytes()));
    if lists_more {
        let listed: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            // A client listing Cookie or Host as hop-by-hop would make the node read
            // a different session or site than the one the gateway routed on.
            .filter(|name| name != header::COOKIE && name != header::HOST)
            .collect();
        for name in listed {
            headers.remove(name);
        }
    }
    while let Some(name) = headers.keys().find(|name| is_hop_by_hop(name)).cloned() {
        headers.remove(name);
    }
}

/// Whether `name` is hop-by-hop whatever `Connection` says.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || is_hop_by_hop_spelt(name.as_str())
}

/// The hop-by-hop names [`HOP_BY_HOP`] does not list.
fn is_hop_by_hop_spelt(name: &str) -> bool {
    name == "keep-alive" || name.starts_with("proxy-")
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const CLIENT_IP: HeaderName = HeaderName::from_static("client-ip");

/// Header hygiene for the upstream request. `Host` is left exactly as the browser sent
/// it, because Moodle compares it with `$CFG->wwwroot` (only a request without one,
/// HTTP/1.0, gets `upstream`'s). The client address travels in `X-Forwarded-For`; a
/// value the client made up is replaced unless the peer is a trusted proxy (so is
/// `Forwarded`, dropped), and `Client-IP` is always dropped because Moodle's
/// `getremoteaddr()` would believe it.
fn prepare_request_headers(headers: &mut HeaderMap, peer: Peer<'_>, upstream: &Authority) {
    let mut found = Found::in_lines(headers);
    if !found.host {
        if let Ok(value) = HeaderValue::from_str(upstream.as_str()) {
            headers.insert(header::HOST, value);
            found.host = true;
        }
    }
    drop_unsafe_lines(headers, &mut found, peer);
    forwarding_lines(headers, &found, peer);
}

/// What one pass over a request's lines found, so that each rule after it looks
/// up only a header that is there (a hashed lookup for each header that is
/// usually absent costs more).
#[derive(Default)]
struct Found {
    client_ip: bool,
    underscored: bool,
    accel: bool,
    forwarded: bool,
    hop_by_hop: bool,
    cookies: usize,
    host: bool,
    has_for: bool,
    has_proto: bool,
    has_host: bool,
}

impl Found {
    fn in_lines(headers: &HeaderMap) -> Self {
        let mut found = Self::default();
        for (name, _) in headers.iter() {
            match *name {
                header::COOKIE => found.cookies += 1,
                header::HOST => found.host = true,
                header::FORWARDED => found.forwarded = true,
                _ => {
                    let spelt = name.as_str();
                    found.hop_by_hop |= HOP_BY_HOP.contains(name) || is_hop_by_hop_spelt(spelt);
                    // A byte loop: names are short, and `memchr`'s set-up costs more.
                    found.underscored |= spelt.bytes().any(|b| b == b'_');
                    if spelt.starts_with("x-") {
                        found.accel |= offload::is_accel(name);
                        found.has_for |= name == X_FORWARDED_FOR;
                        found.has_proto |= name == X_FORWARDED_PROTO;
                        found.has_host |= name == X_FORWARDED_HOST;
                    } else {
                        found.client_ip |= name == CLIENT_IP;
                    }
                }
            }
        }
        found
    }
}

/// Drops the lines that must not reach a node: hop-by-hop ones, `Client-IP`, an
/// untrusted `Forwarded`, a student's `X-Accel-*`, names with `_`; and joins the
/// `Cookie` lines into one, as PHP reads only one.
fn drop_unsafe_lines(headers: &mut HeaderMap, found: &mut Found, peer: Peer<'_>) {
    if found.hop_by_hop {
        strip_listed_hop_by_hop(headers);
        // `Connection` may have listed a trusted proxy's own forwarding lines: gone
        // now, so the gateway's go instead.
        found.has_proto &= headers.contains_key(&X_FORWARDED_PROTO);
        found.has_host &= headers.contains_key(&X_FORWARDED_HOST);
    }
    if found.client_ip {
        headers.remove(CLIENT_IP);
    }
    // Only a node may ask the gateway to fetch a file; a student's own X-Accel-*
    // would reach PHP, and through it any proxy that honours it.
    // RFC 7239's `Forwarded` says the same as `X-Forwarded-*` (`for=`, `proto=`,
    // `host=`), and a framework behind Moodle may read it: only a trusted proxy's
    // passes. The gateway's own hop travels in `X-Forwarded-For`.
    if found.forwarded && !peer.trusted {
        headers.remove(header::FORWARDED);
    }
    if found.accel {
        offload::remove_accel(headers);
    }
    if found.underscored {
        drop_underscored(headers);
    }
    if found.cookies > 1 {
        join_cookie_lines(headers);
    }
}

/// This hop in `X-Forwarded-For`, `-Proto` and `-Host`: appended to a trusted
/// proxy's chain, in place of anything else a client sent.
fn forwarding_lines(headers: &mut HeaderMap, found: &Found, peer: Peer<'_>) {
    let chain = (peer.trusted && found.has_for)
        .then(|| headers.get(&X_FORWARDED_FOR))
        .flatten()
        .and_then(|chain| {
            let mut joined = chain.as_bytes().to_vec();
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(peer.forwarded_for.as_bytes());
            HeaderValue::from_bytes(&joined).ok()
        });
    // Every earlier line goes, so a client cannot smuggle a second one.
    if found.has_for {
        headers.remove(X_FORWARDED_FOR);
    }
    let keep_proto = !peer.tls && peer.trusted && found.has_proto;
    if found.has_proto && !keep_proto {
        headers.remove(X_FORWARDED_PROTO);
    }
    let keep_host = peer.trusted && found.has_host;
    if found.has_host && !keep_host {
        headers.remove(X_FORWARDED_HOST);
    }
    let for_ = chain.unwrap_or_else(|| peer.forwarded_for.clone());
    headers.append(X_FORWARDED_FOR, for_);
    let proto = match (peer.tls, keep_proto) {
        (true, _) => Some("https"),
        (false, true) => None,
        (false, false) => Some("http"),
    };
    if let Some(proto) = proto {
        headers.append(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    if found.host && !keep_host {
        if let Some(host) = headers.get(header::HOST).cloned() {
            headers.append(X_FORWARDED_HOST, host);
        }
    }
}

/// Header names with `_` never reach PHP: PHP turns `-` and `_` alike into `_` in
/// `$_SERVER`, so `X_Forwarded_For` would land on the very key the gateway just set
/// (nginx drops them by default too).
fn drop_underscored(headers: &mut HeaderMap) {
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().contains('_'))
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

/// A cookie of the gateway's own that must never reach a node. Every request's
/// `Cookie` lines are searched for its name, so the search is built once: one
/// SIMD scan per line, and the crumbs are only split when the name is there.
#[derive(Debug, Clone)]
pub struct Withheld {
    name: &'static [u8],
    finder: memchr::memmem::Finder<'static>,
}

impl Withheld {
    /// The cookie called `name`.
    pub fn new(name: &'static str) -> Self {
        let name = name.as_bytes();
        let finder = memchr::memmem::Finder::new(name);
        Self { name, finder }
    }

    /// Removes the cookie from every `Cookie` line, dropping a line left empty.
    /// Lines are read as bytes, so a line with another site's non-ASCII cookie is
    /// cleaned too.
    pub fn strip(&self, headers: &mut HeaderMap) {
        let named =
            |crumb: &[u8]| crumb.trim_ascii_start().split(|&b| b == b'=').next() == Some(self.name);
        let carries = |line: &HeaderValue| {
            let bytes = line.as_bytes();
            self.finder.find(bytes).is_some() && bytes.split(|&b| b == b';').any(named)
        };
        if !headers.get_all(header::COOKIE).iter().any(carries) {
            return;
        }
        let kept: Vec<HeaderValue> = (headers.get_all(header::COOKIE).iter())
            .filter_map(|line| {
                let crumbs = line.as_bytes().split(|&b| b == b';');
                let crumbs: Vec<&[u8]> = crumbs
                    .map(<[u8]>::trim_ascii_start)
                    .filter(|c| !named(c))
                    .collect();
                let joined = crumbs.join(&b"; "[..]);
                let empty = joined.trim_ascii().is_empty();
                (!empty).then(|| HeaderValue::from_bytes(&joined).ok())?
            })
            .collect();
        headers.remove(header::COOKIE);
        for line in kept {
            headers.append(header::COOKIE, line);
        }
    }
}

/// Several `Cookie` lines become one joined by `"; "`. A web server in front of PHP
/// joins repeated headers with `", "`, which PHP does not split, so PHP would read a
/// different session than the one the gateway routed on.
fn join_cookie_lines(headers: &mut HeaderMap) {
    let mut joined = Vec::new();
    for line in headers.get_all(header::COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(line.as_bytes());
    }
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, value);
    }
}

fn ip_header_value(ip: IpAddr) -> HeaderValue {
    let mut buffer = [0u8; 48];
    let len = {
        use std::io::Write;
        let mut cursor = std::io::Cursor::new(&mut buffer[..]);
        write!(cursor, "{ip}").expect("an IP address fits in 48 bytes");
        cursor.position() as usize
    };
    HeaderValue::from_bytes(&buffer[..len]).expect("an IP address is a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_cookie_never_reaches_a_node_and_the_rest_is_kept() {
        let mut headers = HeaderMap::new();
        let line = |v: &'static str| HeaderValue::from_static(v);
        headers.append(
            header::COOKIE,
            line("MoodleSession=abc; gw-admin=secret; theme=x"),
        );
        headers.append(header::COOKIE, line("gw-admin=again"));
        headers.append(header::COOKIE, line("gw-administrator=not-ours"));
        Withheld::new("gw-admin").strip(&mut headers);
        let left: Vec<_> = headers.get_all(header::COOKIE).iter().collect();
        assert_eq!(
            left,
            ["MoodleSession=abc; theme=x", "gw-administrator=not-ours"]
        );
        let mut plain = HeaderMap::new();
        plain.append(header::COOKIE, line("MoodleSession=abc"));
        Withheld::new("gw-admin").strip(&mut plain);
        assert_eq!(plain[header::COOKIE], "MoodleSession=abc");
    }

    fn peer(trusted: bool) -> Peer<'static> {
        let client = Box::leak(Box::new(Client::new("203.0.113.9".parse().unwrap(), false)));
        client.peer(trusted)
    }

    /// The hop_by_hop, as the node reads the map.
    fn prepared(map: &mut HeaderMap, trusted: bool) {
        let upstream = Authority::from_static("10.0.0.11:80");
        prepare_request_headers(map, peer(trusted), &upstream);
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn connection_listed_and_fixed_hop_by_hop_headers_are_removed() {
        let mut map = headers(&[
            ("connection", "keep-alive, X-Secret-Hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic x"),
            ("upgrade", "websocket"),
            ("cookie", "MoodleSession=abc"),
        ]);
        strip_hop_by_hop(&mut map);
        let left: Vec<_> = map.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["cookie"]);
    }

    #[test]
    fn a_nodes_keep_alive_and_close_are_removed_and_nothing_else() {
        for value in ["keep-alive", "close", "Keep-Alive, close", " , "] {
            let mut map = headers(&[
                ("connection", value),
                ("set-cookie", "MoodleSession=abc; path=/"),
                ("content-length", "5"),
            ]);
            strip_hop_by_hop(&mut map);
            let mut left: Vec<_> = map.keys().map(|k| k.as_str()).collect();
            left.sort_unstable();
            assert_eq!(
                left,
                ["content-length", "set-cookie"],
                "Connection: {value}"
            );
        }
    }

    #[test]
    fn connection_cannot_strip_the_cookie_or_host_the_gateway_routed_on() {
        let mut map = headers(&[
            ("connection", "cookie, host, x-hop"),
            ("cookie", "MoodleSession=abc"),
            ("host", "moodle.example.edu"),
            ("x-hop", "1"),
        ]);
        strip_hop_by_hop(&mut map);
        let mut left: Vec<_> = map.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["cookie", "host"]);
    }

    #[test]
    fn client_supplied_forwarding_headers_are_replaced() {
        let mut map = headers(&[
            ("host", "moodle.example.edu"),
            ("x-forwarded-for", "1.2.3.4"),
            ("x-forwarded-for", "5.6.7.8"),
            ("x-forwarded-host", "evil.example"),
            ("client-ip", "1.2.3.4"),
            ("forwarded", "for=1.2.3.4;proto=https;host=evil.example"),
        ]);
        prepared(&mut map, false);
        assert!(!map.contains_key(header::FORWARDED));
        assert_eq!(map.get_all(&X_FORWARDED_FOR).iter().count(), 1);
        assert_eq!(map[&X_FORWARDED_FOR], "203.0.113.9");
        assert_eq!(map[&X_FORWARDED_HOST], "moodle.example.edu");
        assert_eq!(map[&X_FORWARDED_PROTO], "http");
        assert_eq!(map[header::HOST], "moodle.example.edu");
        assert!(!map.contains_key(CLIENT_IP));
    }

    #[test]
    fn a_trusted_proxy_chain_is_extended() {
        let mut map = headers(&[
            ("x-forwarded-for", "198.51.100.1"),
            ("x-forwarded-proto", "https"),
            ("forwarded", "for=198.51.100.1;proto=https"),
        ]);
        prepared(&mut map, true);
        assert_eq!(map[header::FORWARDED], "for=198.51.100.1;proto=https");
        assert_eq!(map[&X_FORWARDED_FOR], "198.51.100.1, 203.0.113.9");
        assert_eq!(map[&X_FORWARDED_PROTO], "https");
    }

    #[test]
    fn header_names_with_underscores_never_reach_php() {
        let mut map = headers(&[
            ("x_forwarded_for", "1.2.3.4"),
            ("client_ip", "1.2.3.4"),
            ("x-real", "kept"),
        ]);
        prepared(&mut map, false);
        assert!(map.keys().all(|name| !name.as_str().contains('_')));
        assert_eq!(map["x-real"], "kept");
        assert_eq!(map[&X_FORWARDED_FOR], "203.0.113.9");
    }

    #[test]
    fn forwarding_lines_a_trusted_proxy_named_hop_by_hop_are_the_gateways() {
        let mut map = headers(&[
            ("host", "moodle.example.edu"),
            ("connection", "x-forwarded-proto, x-forwarded-host"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "elsewhere.example"),
        ]);
        prepared(&mut map, true);
        let proto: Vec<_> = map.get_all(&X_FORWARDED_PROTO).iter().collect();
        let host: Vec<_> = map.get_all(&X_FORWARDED_HOST).iter().collect();
        assert_eq!(proto, ["http"]);
        assert_eq!(host, ["moodle.example.edu"]);
    }

    #[test]
    fn a_request_without_a_host_names_its_node_in_both_host_lines() {
        let mut map = headers(&[("cookie", "MoodleSession=abc")]);
        prepared(&mut map, false);
        assert_eq!(map[header::HOST], "10.0.0.11:80");
        assert_eq!(map[&X_FORWARDED_HOST], "10.0.0.11:80");
    }

    #[test]
    fn several_cookie_lines_reach_php_as_one() {
        let mut map = headers(&[("cookie", "MOODLEID1_=x"), ("cookie", "MoodleSession=abc")]);
        prepared(&mut map, false);
        let lines: Vec<_> = map.get_all(header::COOKIE).iter().collect();
        assert_eq!(lines, ["MOODLEID1_=x; MoodleSession=abc"]);
    }

    #[test]
    fn an_absolute_target_reaches_the_node_in_origin_form_byte_for_byte() {
        let original: Uri =
            "https://moodle.example.edu/pluginfile.php?file=%2F1%2Fmod_scorm%2Fx&a=b+c"
                .parse()
                .unwrap();
        assert_eq!(
            origin_form(&original).to_string(),
            "/pluginfile.php?file=%2F1%2Fmod_scorm%2Fx&a=b+c"
        );
    }
}

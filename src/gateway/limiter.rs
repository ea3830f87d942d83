//! The rate limits (`[rate_limits]`) as a tower layer: login attempts per address
//! and per username, page views without a logged-in session per address, answered
//! `429` with `Retry-After` past their bucket.
//!
//! What it never limits: a request of a live, logged-in session this gateway bound
//! (the Moodle session is the proof a password already got in), nor anything but
//! pages and logins (theme, JavaScript, SCORM files, the app's web-service calls,
//! which carry a token). The order of its questions keeps a student's cost near
//! nothing: the limits in force (one pointer compare), the kind of request (pure
//! functions over the path), then the session (its key and one shard read of the
//! table); the client's address is read and hashed only for a request that may
//! be limited.
//!
//! A login's username is in its body: only a urlencoded body of at most
//! [`LOGIN_FORM_MAX`] bytes (Moodle's form is a few hundred) is read, under
//! `timeouts.body_idle`, and passed on as it came; any other body is passed on
//! unread and its attempt counted per address only.

mod buckets;

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::Either;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited as LimitedBody};
use ipnet::IpNet;
use tower::{Layer, Service};

pub use buckets::{address_key, Bucket, Buckets};

use super::{Gateway, ProxyBody, SettingsCache};
use crate::error::GatewayError;
use crate::http::h1::server::StudentBody;
use crate::http::upstream::proxy::Client;
use crate::logs::Every;
use crate::metrics::Limited;
use crate::moodle::{self, RequestKind, LOGIN_FORM_MAX};

/// A refusal answered at once, the inner service's answer, or a login's checks
/// and then the inner service's answer.
type Checked<F, E> = Either<
    Ready<Result<Response<ProxyBody>, E>>,
    Either<F, Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, E>> + Send>>>,
>;

/// Applies the rate limits of the settings in force to requests from `client`.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    gateway: Arc<Gateway>,
    client: Arc<Client>,
}

impl RateLimitLayer {
    /// The limits for requests from `client`, counted in `gateway`'s metrics.
    pub fn new(gateway: Arc<Gateway>, client: Arc<Client>) -> Self {
        Self { gateway, client }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            settings: self.gateway.settings_cache(),
            gateway: self.gateway.clone(),
            client: self.client.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around `S`.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    settings: SettingsCache,
    gateway: Arc<Gateway>,
    client: Arc<Client>,
}

impl<S> Service<Request<StudentBody>> for RateLimit<S>
where
    S: Service<Request<StudentBody>, Response = Response<ProxyBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Checked<S::Future, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<StudentBody>) -> Self::Future {
        let settings = self.settings.load();
        let Some(buckets) = &settings.rate_limits else {
            return Either::Right(Either::Left(self.inner.call(request)));
        };
        let uri = request.uri();
        // With `pages_per_address` off (the default) only a login can be limited,
        // and most paths cannot be one: they pass without a classification here.
        if buckets.pages_address.is_none() && !moodle::may_try_password(uri.path()) {
            return Either::Right(Either::Left(self.inner.call(request)));
        }
        let Ok(kind) = self.gateway.site.classify(uri.path(), uri.query()) else {
            // The journey refuses it.
            return Either::Right(Either::Left(self.inner.call(request)));
        };
        let attempt = moodle::login_attempt(kind, request.method() == Method::POST);
        // With `pages_per_address` off (the default) a page is never limited.
        let page = matches!(kind, RequestKind::Page(_)) && buckets.pages_address.is_some();
        if (attempt.is_none() && !page) || self.gateway.logged_in(request.headers()) {
            return Either::Right(Either::Left(self.inner.call(request)));
        }
        let address = client_address(request.headers(), self.client.ip, &settings.trusted_proxies);
        if attempt.is_none() {
            let limited = (buckets.pages_address.as_ref())
                .and_then(|bucket| bucket.check(&address_key(address)).err());
            return match limited {
                Some(wait) => {
                    let limited = Limited::PagesPerAddress;
                    let answer = refused(&self.gateway, limited, wait, &request, address);
                    Either::Left(ready(Ok(answer)))
                }
                None => Either::Right(Either::Left(self.inner.call(request))),
            };
        }
        // The inner service goes with the login's future; this one keeps a clone.
        let inner = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, inner);
        let login = Login {
            buckets: buckets.clone(),
            body_idle: settings.bounds.body_idle,
            gateway: self.gateway.clone(),
            client: self.client.clone(),
            address,
        };
        Either::Right(Either::Right(Box::pin(login.checked(request, inner))))
    }
}

/// The `429`, counted and logged (at most once per interval per limit).
fn refused<B>(
    gateway: &Gateway,
    limited: Limited,
    wait: Duration,
    request: &Request<B>,
    address: IpAddr,
) -> Response<ProxyBody> {
    let metrics = gateway.metrics();
    metrics.own_answer(429);
    metrics.rate_limited(limited);
    let kind = limited.as_str();
    if let Some(held_back) = LOGGED[limited as usize].allow() {
        tracing::info!(
            limit = kind,
            method = %request.method(),
            target = %moodle::masked(request.uri()),
            client = %address,
            held_back,
            "request refused: rate limit {kind}"
        );
    }
    let agent = request.headers().get(USER_AGENT).map(HeaderValue::as_bytes);
    let app = (gateway.site).is_app_request(request.uri().path(), agent);
    too_many(limited, wait, app).map(http_body_util::Either::Right)
}

/// Each limit's refusals are logged at most once every ten seconds: a botnet
/// sends thousands, and the counts are in `/metrics`.
static LOGGED: [Every; 3] = [
    Every::new(Duration::from_secs(10)),
    Every::new(Duration::from_secs(10)),
    Every::new(Duration::from_secs(10)),
];

/// One login attempt on its way through the limits.
struct Login {
    buckets: Arc<Buckets>,
    body_idle: Duration,
    gateway: Arc<Gateway>,
    client: Arc<Client>,
    address: IpAddr,
}

impl Login {
    /// Reads the username, takes a token of the address's bucket and then of the
    /// username's, and passes the request on intact, or answers `429`.
    async fn checked<S>(
        self,
        request: Request<StudentBody>,
        mut inner: S,
    ) -> Result<Response<ProxyBody>, Infallible>
    where
        S: Service<Request<StudentBody>, Response = Response<ProxyBody>, Error = Infallible>,
    {
        let (parts, body) = request.into_parts();
        let (body, form) = match form_body(&parts.headers, &body) {
            true => match tokio::time::timeout(self.body_idle, read_whole(body)).await {
                Ok(Ok(bytes)) => (StudentBody::read(bytes.clone()), Some(bytes)),
                Ok(Err(_)) | Err(_) => {
                    let request = Request::from_parts(parts, ());
                    let timeout = GatewayError::ClientTimeout;
                    return Ok(self.gateway.refused(timeout, &request, &self.client));
                }
            },
            false => (body, None),
        };
        let query = parts.uri.query().map(str::as_bytes);
        let username = form.as_deref().and_then(moodle::username_in);
        let username = username.or_else(|| query.and_then(moodle::username_in));
        let request = Request::from_parts(parts, body);
        if let Some((limited, wait)) = self.limited(username.as_deref()) {
            return Ok(refused(
                &self.gateway,
                limited,
                wait,
                &request,
                self.address,
            ));
        }
        inner.call(request).await
    }

    /// The limit this attempt is past, with the wait until its next token.
    fn limited(&self, username: Option<&str>) -> Option<(Limited, Duration)> {
        let buckets = &self.buckets;
        if let Some(bucket) = &buckets.login_address {
            if let Err(wait) = bucket.check(&address_key(self.address)) {
                return Some((Limited::LoginPerAddress, wait));
            }
        }
        let (bucket, username) = (buckets.login_username.as_ref()?, username?);
        let wait = bucket.check(&buckets.username_key(username)).err()?;
        Some((Limited::LoginPerUsername, wait))
    }
}

/// Whether a login's body is one the limits read: urlencoded (as Moodle's form
/// and the app send it) and small enough to be a login form.
fn form_body(headers: &HeaderMap, body: &StudentBody) -> bool {
    let urlencoded = (headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes)).is_some_and(|t| {
        t.len() >= 33 && t[..33].eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
    });
    let small = (body.size_hint().upper()).is_some_and(|n| n <= LOGIN_FORM_MAX as u64);
    urlencoded && small && !body.is_end_stream()
}

/// The whole body, at most [`LOGIN_FORM_MAX`] bytes.
async fn read_whole(body: StudentBody) -> Result<Bytes, crate::http::body::BoxError> {
    let collected = LimitedBody::new(body, LOGIN_FORM_MAX).collect().await?;
    Ok(collected.to_bytes())
}

/// The client's address: the TCP peer's, or, when the peer is one of
/// `trusted_proxies`, the last address in `X-Forwarded-For` that is not itself
/// a trusted proxy (the one the nearest trusted proxy saw). The lines the
/// client wrote itself, to the left, are never believed.
pub fn client_address(headers: &HeaderMap, peer: IpAddr, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let lines = headers.get_all("x-forwarded-for").iter().rev();
    let hops = lines.flat_map(|line| line.as_bytes().rsplit(|&b| b == b','));
    let mut client = peer;
    for hop in hops {
        let parsed = std::str::from_utf8(hop.trim_ascii()).ok();
        let Some(ip) = parsed.and_then(|hop| hop.parse::<IpAddr>().ok()) else {
            break;
        };
        client = ip;
        if !is_trusted(&ip) {
            break;
        }
    }
    client
}

/// The `429`: JSON in Moodle's error fields for the app, a small page for a
/// browser, with `Retry-After` in whole seconds (at least 1).
pub fn too_many(limited: Limited, wait: Duration, app: bool) -> Response<Full<Bytes>> {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let seconds = seconds.max(1);
    let what = match limited {
        Limited::LoginPerAddress | Limited::LoginPerUsername => "Too many login attempts",
        Limited::PagesPerAddress => "Too many requests from your network",
    };
    let message = format!("{what}; please try again in {seconds} seconds.");
    let (body, content_type) = match app {
        true => (
            serde_json::json!({
                "exception": "moodle_exception",
                "errorcode": "rate_limited",
                "message": message,
                "error": message,
            })
            .to_string(),
            "application/json; charset=utf-8",
        ),
        // `message` is built from fixed words and a number: nothing to escape.
        false => (
            format!(
                "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
                 <meta name=\"robots\" content=\"noindex\"><title>{what}</title></head>\
                 <body><h1>{what}</h1><p>{message}</p></body></html>\n"
            ),
            "text/html; charset=utf-8",
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    response
}

#[cfg(test)]
mod tests;

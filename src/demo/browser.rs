//! [`Browser`]: a simulated browser (pooled HTTP/1 client, one-cookie jar holding the
//! session cookie) and the [`Reply`] it reads to the end.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A student whose request takes longer than this is stuck, not slow.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One simulated browser: a pooled HTTP/1 client and a one-cookie jar holding just
/// the session cookie, updated from every `Set-Cookie` like a browser would.
#[derive(Clone)]
pub struct Browser {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    cookie: String,
    session: Option<String>,
    requests: u64,
}

/// One response, read to the end.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
    /// The session id this response set, if it set the session cookie to a value.
    pub issued: Option<String>,
}

impl Reply {
    /// `X-Upstream`: which stand-in answered.
    pub fn upstream(&self) -> &str {
        self.header("x-upstream")
    }

    /// `Location`, or `""`.
    pub fn location(&self) -> &str {
        self.header(LOCATION.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// One header as text, or `""`.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// `"{what}: {status} from {upstream}: want {want}"`, for a failure report.
    pub fn unexpected(&self, what: &str, want: &str) -> String {
        format!(
            "{what}: {} from {}: want {want}",
            self.status,
            self.upstream()
        )
    }

    /// Moodle's `require_login()` bounced the request: the session was not there.
    pub fn sent_to_login(&self) -> bool {
        self.status == StatusCode::SEE_OTHER && self.location().contains("/login/index.php")
    }
}

impl Browser {
    /// A browser for the site at `http://{server}{site_path}` with session cookie `cookie`.
    pub fn new(server: SocketAddr, site_path: &str, cookie: &str) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self::with_client(client, server, site_path, cookie)
    }

    /// Shares a connection pool, so a thousand students do not hold a thousand sockets.
    pub(super) fn with_client(
        client: Client<HttpConnector, Full<Bytes>>,
        server: SocketAddr,
        site_path: &str,
        cookie: &str,
    ) -> Self {
        let base = format!("http://{server}{site_path}");
        Self {
            client,
            base,
            cookie: cookie.to_owned(),
            session: None,
            requests: 0,
        }
    }

    /// The same browser, jar and all, sent to another gateway of the site (a DNS
    /// answer that changed, a floating address that moved).
    pub fn at(&self, server: SocketAddr) -> Self {
        let path = self
            .base
            .splitn(4, '/')
            .nth(3)
            .map_or(String::new(), |p| format!("/{p}"));
        let mut moved = Self::with_client(self.client.clone(), server, &path, &self.cookie);
        moved.session = self.session.clone();
        moved
    }

    /// The session id in the jar.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// Replaces the jar's session id (to replay a stolen or stale cookie).
    pub fn set_session(&mut self, id: Option<String>) {
        self.session = id;
    }

    /// Requests sent so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// `GET {site}{path}`.
    pub async fn get(&mut self, path: &str) -> Result<Reply, String> {
        self.send(Method::GET, path, None, &[]).await
    }

    /// `POST {site}{path}` with a form body.
    pub async fn post(&mut self, path: &str, form: &str) -> Result<Reply, String> {
        self.send(Method::POST, path, Some(form), &[]).await
    }

    /// Sends one request with the jar's cookie and `headers`, reads the whole reply
    /// and keeps any session cookie it sets. `Err` means no HTTP reply at all.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        form: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Reply, String> {
        let what = format!("{method} {path}");
        let request = self
            .request(method, path, form, headers)
            .map_err(|e| format!("{what}: {e}"))?;
        self.requests += 1;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("{e:?}"))?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok::<_, String>((parts, body))
        };
        let (parts, body) = match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(result) => result.map_err(|e| format!("{what}: {e}"))?,
            Err(_) => return Err(format!("{what}: no reply within {REQUEST_TIMEOUT:?}")),
        };
        let issued = self.keep_cookie(&parts.headers);
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
            issued,
        })
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        form: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Request<Full<Bytes>>, http::Error> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(id) = &self.session {
            request = request.header(COOKIE, format!("{}={id}", self.cookie));
        }
        if form.is_some() {
            request = request.header(CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(Full::new(Bytes::from(form.unwrap_or("").to_owned())))
    }

    /// The last `Set-Cookie` for our cookie wins; `deleted` or empty clears the jar.
    fn keep_cookie(&mut self, headers: &HeaderMap) -> Option<String> {
        let value = headers
            .get_all(SET_COOKIE)
            .iter()
            .rev()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|line| line.split(';').next()?.trim().split_once('='))
            .find(|(name, _)| *name == self.cookie)?
            .1;
        let issued = (!value.is_empty() && value != "deleted").then(|| value.to_owned());
        self.session = issued.clone();
        issued
    }
}

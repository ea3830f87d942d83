//! A small scripted browser: one student's cookie jar, redirects followed by hand, and
//! a record of every `MoodleSession` the site set, so a test can tell a planned
//! rotation (login, logout) from a lost session.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Moodle's session cookie (`$CFG->sessioncookie` is empty on the test site).
pub const SESSION_COOKIE: &str = "MoodleSession";

/// An HTTP/1.1 client with keep-alive and nothing else.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A new client.
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One response, as the browser received it.
#[derive(Debug)]
pub struct Page {
    /// `GET /path?query` as requested.
    pub request: String,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// When its body had been read to the end.
    pub read: std::time::Instant,
}

impl Page {
    /// The `X-Moodle-Node` header: which Moodle ran the script (none for plain files).
    pub fn node(&self) -> Option<&str> {
        self.header("x-moodle-node")
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// One line for a failure message: the request, status, node and, for Moodle's
    /// error pages, the error Moodle printed (`errormessage` for an exception, the
    /// `alert-danger` box for one raised while the page was set up), else the page's
    /// start.
    pub fn brief(&self) -> String {
        let text = self.text();
        let said = ["<p class=\"errormessage\">", "<div class='alert-danger'>"]
            .iter()
            .find_map(|open| {
                let (_, rest) = text.split_once(open)?;
                Some(rest.split_once('<').map_or(rest, |(message, _)| message))
            });
        let shown: String = match said {
            Some(message) => format!("Moodle said: {message}"),
            None => text.chars().take(160).collect(),
        };
        format!(
            "{} {} (node {:?}) {:?}",
            self.request,
            self.status,
            self.node(),
            shown.split_whitespace().collect::<Vec<_>>().join(" ")
        )
    }

    /// The new session id this response sets, if any (the last such line counts).
    pub fn sets_session(&self) -> Option<String> {
        self.headers
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .filter_map(|line| {
                let (name, value) = line.split(';').next()?.split_once('=')?;
                (name.trim() == SESSION_COOKIE).then(|| value.trim().to_string())
            })
            .next_back()
    }
}

/// Sends one request; the response with its whole body.
pub async fn exchange(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<String>,
) -> Page {
    try_exchange(client, method, url, headers, body, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The lines a browser sends of itself with every request (Firefox's, but for
/// `Accept`, which a test sets, and `Accept-Encoding`, left out so that Moodle
/// answers uncompressed). Moodle reads `User-Agent`: its pages' `<body>` carries
/// the browser's family as a class (`gecko`).
pub const BROWSER_LINES: [(&str, &str); 6] = [
    (
        "user-agent",
        "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    ),
    ("accept-language", "en-GB,en;q=0.5"),
    ("dnt", "1"),
    ("upgrade-insecure-requests", "1"),
    ("sec-fetch-mode", "navigate"),
    ("sec-fetch-site", "same-origin"),
];

/// [`exchange`], failing rather than panicking: no answer (and whole body) within
/// `limit`, or a connection the far side broke, is an `Err` naming the request.
pub async fn try_exchange(
    client: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, String)],
    body: Option<String>,
    limit: Duration,
) -> Result<Page, String> {
    let mut request = Request::builder().method(method.clone()).uri(url);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    if body.is_some() {
        request = request.header("content-type", "application/x-www-form-urlencoded");
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let whole = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| format!("body: {e}"))?;
        Ok::<_, String>((parts, body.to_bytes()))
    };
    let (parts, body) = tokio::time::timeout(limit, whole)
        .await
        .map_err(|_| format!("{method} {url}: no answer within {limit:?}"))?
        .map_err(|e| format!("{method} {url}: {e}"))?;
    let target = url.splitn(4, '/').nth(3).unwrap_or("");
    // Moodle's own lines (and an offloaded file's, which the export also sends):
    // every answer carries each of them once.
    for name in [
        "date",
        "server",
        "x-powered-by",
        "x-frame-options",
        "content-language",
    ] {
        let lines = parts.headers.get_all(name).iter().count();
        if lines > 1 {
            return Err(format!(
                "{method} /{target}: {lines} {name} lines: {:?}",
                parts.headers
            ));
        }
    }
    Ok(Page {
        request: format!("{method} /{target}"),
        status: parts.status,
        headers: parts.headers,
        body,
        read: std::time::Instant::now(),
    })
}

/// One student's browser, talking to the gateway only.
pub struct Browser {
    client: HttpClient,
    /// `http://127.0.0.1:PORT`: the gateway, Moodle's wwwroot.
    origin: String,
    /// Several gateways behind wwwroot's one name (DNS round robin): each request
    /// goes to the next of these, with wwwroot's `Host`. Empty: to `origin` itself.
    gateways: Vec<SocketAddr>,
    /// The turn of the next request among `gateways`.
    turn: usize,
    cookies: BTreeMap<String, String>,
    /// Whether the student is logged in (between a login and a logout).
    pub logged_in: bool,
    /// Every session id the site gave this browser, in order, with the request.
    pub sessions: Vec<(String, String)>,
    /// What went wrong with the session while logged in: each is a lost session.
    pub lost: Vec<String>,
    /// Every request sent with the jar while logged in, with the Moodle that ran it
    /// (`X-Moodle-Node`; `None` for a plain file).
    pub served: Vec<(String, Option<String>)>,
    /// Requests sent.
    pub requests: usize,
    /// The `Accept` header of every request, if any (a browser's page view sends
    /// `text/html`, which the waiting room looks for).
    pub accept: Option<&'static str>,
    /// How long one request may take, its whole body included.
    pub limit: Duration,
}

impl Browser {
    /// A browser with an empty jar.
    pub fn new(client: HttpClient, origin: &str) -> Browser {
        Browser {
            client,
            origin: origin.to_string(),
            gateways: Vec::new(),
            turn: 0,
            cookies: BTreeMap::new(),
            logged_in: false,
            sessions: Vec::new(),
            lost: Vec::new(),
            served: Vec::new(),
            requests: 0,
            accept: None,
            limit: Duration::from_secs(120),
        }
    }

    /// A browser whose every request (each redirect hop included) goes to the next of
    /// `gateways` in turn, starting with `gateways[first % len]`, as a client of a
    /// round-robin DNS name does: the address changes, wwwroot's `Host` does not.
    pub fn round_robin(
        client: HttpClient,
        origin: &str,
        gateways: &[SocketAddr],
        first: usize,
    ) -> Browser {
        Browser {
            gateways: gateways.to_vec(),
            turn: first,
            ..Browser::new(client, origin)
        }
    }

    /// GET `path`, following redirects; every hop, the last one being the page.
    pub async fn get(&mut self, path: &str) -> Vec<Page> {
        self.visit(Method::GET, path, None).await
    }

    /// POSTs `fields` as a form to `path`, following redirects.
    pub async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Vec<Page> {
        self.visit(Method::POST, path, Some(form(fields))).await
    }

    /// One GET without any cookie and without touching the jar (what the gateway must
    /// route without a session), counted like the rest.
    pub async fn get_bare(&mut self, path: &str) -> Page {
        self.requests += 1;
        let mut headers = Vec::new();
        let url = self.target(path, &mut headers);
        exchange(&self.client, Method::GET, &url, &headers, None).await
    }

    /// One request with the jar and `extra` headers, no redirect followed (a Range or
    /// HEAD request), recorded and learned from like the rest.
    pub async fn send(&mut self, method: Method, path: &str, extra: &[(&str, String)]) -> Page {
        self.one(method, path, None, extra).await
    }

    /// The path part of a URL Moodle built; panics on a URL off the wwwroot (Moodle
    /// always redirects to wwwroot, never to a node's address).
    pub fn path_of(&self, url: &str) -> String {
        let url = url.replace("\\/", "/").replace("&amp;", "&");
        match url.strip_prefix(&self.origin) {
            Some(path) if path.starts_with('/') => path.to_string(),
            Some("") => "/".to_string(),
            _ if url.starts_with('/') => url,
            _ => panic!("{url} is not under the wwwroot {}", self.origin),
        }
    }

    async fn visit(&mut self, method: Method, path: &str, body: Option<String>) -> Vec<Page> {
        (self.try_visit(method, path, body).await).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`get`](Self::get), failing rather than panicking when a request gets no answer
    /// within [`limit`](Self::limit) or its connection breaks.
    pub async fn try_get(&mut self, path: &str) -> Result<Vec<Page>, String> {
        self.try_visit(Method::GET, path, None).await
    }

    /// [`post`](Self::post), failing rather than panicking.
    pub async fn try_post(
        &mut self,
        path: &str,
        fields: &[(&str, &str)],
    ) -> Result<Vec<Page>, String> {
        self.try_visit(Method::POST, path, Some(form(fields))).await
    }

    async fn try_visit(
        &mut self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<Vec<Page>, String> {
        let mut hops = vec![self.try_one(method, path, body, &[]).await?];
        while let Some(location) = redirect(hops.last().unwrap()) {
            if hops.len() >= 10 {
                return Err(format!("a redirect loop: {:?}", requests(&hops)));
            }
            let next = self.path_of(&location);
            hops.push(self.try_one(Method::GET, &next, None, &[]).await?);
        }
        Ok(hops)
    }

    async fn one(
        &mut self,
        method: Method,
        path: &str,
        body: Option<String>,
        extra: &[(&str, String)],
    ) -> Page {
        (self.try_one(method, path, body, extra).await).unwrap_or_else(|e| panic!("{e}"))
    }

    async fn try_one(
        &mut self,
        method: Method,
        path: &str,
        body: Option<String>,
        extra: &[(&str, String)],
    ) -> Result<Page, String> {
        self.requests += 1;
        let mut headers = extra.to_vec();
        let url = self.target(path, &mut headers);
        if !self.cookies.is_empty() {
            let jar: Vec<String> = self
                .cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            headers.push(("cookie", jar.join("; ")));
        }
        if let Some(accept) = self.accept {
            headers.push(("accept", accept.to_string()));
        }
        // What a browser says of itself: the gateway passes these lines to Moodle
        // around its header map.
        for (name, value) in BROWSER_LINES {
            headers.push((name, value.to_string()));
        }
        let page = try_exchange(&self.client, method, &url, &headers, body, self.limit).await?;
        if self.logged_in {
            let node = page.node().map(str::to_string);
            self.served.push((page.request.clone(), node));
        }
        self.learn(&page);
        Ok(page)
    }

    /// The URL for `path`: on wwwroot itself, or on the next gateway, with wwwroot's
    /// authority added to `headers` as `Host` (hyper keeps an explicit one), which
    /// Moodle and the gateway's `[site]` hosts check.
    fn target(&mut self, path: &str, headers: &mut Vec<(&str, String)>) -> String {
        if self.gateways.is_empty() {
            return format!("{}{path}", self.origin);
        }
        let gateway = self.gateways[self.turn % self.gateways.len()];
        self.turn += 1;
        let authority = self.origin.trim_start_matches("http://");
        headers.push(("host", authority.to_string()));
        format!("http://{gateway}{path}")
    }

    fn learn(&mut self, page: &Page) {
        let logout = page.request.starts_with("GET /login/logout.php");
        let login = page.request.starts_with("POST /login/index.php");
        for line in page.headers.get_all("set-cookie").iter() {
            let Some((name, value)) = line.to_str().ok().and_then(cookie) else {
                continue;
            };
            if value.is_empty()
                || value == "deleted"
                || line.to_str().unwrap().contains("Max-Age=0")
            {
                self.cookies.remove(&name);
            } else {
                self.cookies.insert(name.clone(), value.clone());
            }
            if name == SESSION_COOKIE {
                if self.logged_in && !logout && !login {
                    self.lost
                        .push(format!("{}: Moodle set a new session", page.request));
                }
                self.sessions.push((page.request.clone(), value));
            }
        }
        if self.logged_in {
            if let Some(location) = redirect(page) {
                if location.contains("/login/index.php") && !logout {
                    self.lost
                        .push(format!("{}: redirected to the login page", page.request));
                }
            }
        }
    }
}

/// `name=value` of a `Set-Cookie` line.
fn cookie(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split(';').next()?.split_once('=')?;
    Some((name.trim().to_string(), value.trim().to_string()))
}

/// The `Location` of a redirect.
pub fn redirect(page: &Page) -> Option<String> {
    page.status
        .is_redirection()
        .then(|| page.header("location").map(str::to_string))
        .flatten()
}

/// The requests of `hops`, for messages.
pub fn requests(hops: &[Page]) -> Vec<String> {
    hops.iter()
        .map(|p| format!("{} -> {}", p.request, p.status))
        .collect()
}

/// `application/x-www-form-urlencoded` of `fields`.
pub fn form(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encodes everything but unreserved characters.
pub fn encode(text: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(text, SET).to_string()
}

/// The text between `before` and the next `until`, after the first `before`.
pub fn between<'a>(text: &'a str, before: &str, until: &str) -> Option<&'a str> {
    let start = text.find(before)? + before.len();
    let len = text[start..].find(until)?;
    Some(&text[start..start + len])
}

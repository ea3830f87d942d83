//! How the doctor talks to a node: one request on one fresh connection, the way a
//! student's request reaches it through the gateway (the public `Host`, the
//! forwarding headers), so what the node answers is what a student would get.
//! Never more than one request at a time to a node, each bounded by a deadline.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_TYPE, COOKIE, DATE, HOST, LOCATION, USER_AGENT};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::moodle::{IssuedSession, Site};

/// The most of a body the doctor reads: a Moodle page is well under this; a file
/// fetched to prove the export serves it is only counted.
const PAGE_BYTES: usize = 4 << 20;

/// What a node answered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// A header as text ("" when absent or not text).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// `Location`, if the answer is a redirect.
    pub fn location(&self) -> Option<&str> {
        self.status
            .is_redirection()
            .then(|| self.headers.get(LOCATION)?.to_str().ok())
            .flatten()
    }

    /// The body as text, for pages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The node's clock, from `Date`.
    pub fn date(&self) -> Option<SystemTime> {
        httpdate(self.headers.get(DATE)?.to_str().ok()?)
    }

    /// "303 → http://…/login/index.php", "200", for a finding's "saw".
    pub fn summary(&self) -> String {
        match self.location() {
            Some(to) => format!("{} with Location: {to}", self.status),
            None => self.status.to_string(),
        }
    }
}

/// Sends requests as the gateway would forward them.
pub struct Asker {
    /// wwwroot's authority: the `Host` every student's request carries.
    pub public_host: HeaderValue,
    /// `https` when students reach the gateway over TLS.
    pub forwarded_proto: &'static str,
    /// One request's whole time.
    pub timeout: Duration,
    /// The session cookie's name and path, to follow a node's `Set-Cookie`.
    pub site: Site,
    pub cookie: String,
}

/// One visitor's session on one node: the cookie a node gave, sent back each time.
#[derive(Debug, Clone, Default)]
pub struct Visitor {
    pub session: Option<String>,
}

impl Asker {
    /// `GET path` on `authority` as `visitor`, who keeps any session the node sets.
    pub async fn get(
        &self,
        authority: &str,
        path: &str,
        visitor: &mut Visitor,
    ) -> Result<Answer, String> {
        self.send(authority, Method::GET, path, None, visitor, None)
            .await
    }

    /// `POST path` with a form body.
    pub async fn post_form(
        &self,
        authority: &str,
        path: &str,
        form: String,
        visitor: &mut Visitor,
    ) -> Result<Answer, String> {
        self.send(authority, Method::POST, path, Some(form), visitor, None)
            .await
    }

    /// `GET path` with another `Host` (the health probe's) and no session.
    pub async fn get_as(&self, authority: &str, path: &str, host: &str) -> Result<Answer, String> {
        let host = HeaderValue::from_str(host).map_err(|_| format!("bad Host {host:?}"))?;
        let mut nobody = Visitor::default();
        self.send(authority, Method::GET, path, None, &mut nobody, Some(host))
            .await
    }

    async fn send(
        &self,
        authority: &str,
        method: Method,
        path: &str,
        form: Option<String>,
        visitor: &mut Visitor,
        host: Option<HeaderValue>,
    ) -> Result<Answer, String> {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, host.unwrap_or_else(|| self.public_host.clone()))
            .header(USER_AGENT, "moodle-gateway-doctor")
            .header(CONNECTION, "close")
            .header("x-forwarded-for", "127.0.0.1")
            .header("x-forwarded-proto", self.forwarded_proto);
        if let Some(id) = &visitor.session {
            request = request.header(COOKIE, format!("{}={id}", self.cookie));
        }
        let body = match form {
            Some(form) => {
                request = request.header(CONTENT_TYPE, "application/x-www-form-urlencoded");
                Bytes::from(form)
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(body))
            .map_err(|e| format!("cannot build the request for {path}: {e}"))?;
        let answer = tokio::time::timeout(self.timeout, exchange(authority, request))
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))??;
        match self.site.issued_session(&answer.headers) {
            Some(IssuedSession::Id(id)) => visitor.session = Some(id.to_owned()),
            Some(IssuedSession::Cleared) => visitor.session = None,
            None => {}
        }
        Ok(answer)
    }
}

async fn exchange(authority: &str, request: Request<Full<Bytes>>) -> Result<Answer, String> {
    let stream = TcpStream::connect(authority)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("no HTTP: {e}"))?;
    let driver = tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("the exchange failed: {e}"))?;
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, PAGE_BYTES)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    driver.abort();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the only form RFC 9110 lets a
/// server send; anything else is `None`.
fn httpdate(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(&rfc3339(text)?).ok()
}

fn rfc3339(text: &str) -> Option<String> {
    let mut parts = text.split_ascii_whitespace();
    let (_day, date, month, year, time, zone) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = months.iter().position(|m| *m == month)? + 1;
    (zone == "GMT").then(|| format!("{year}-{month:02}-{date:0>2}T{time}Z"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_clock_is_read_from_its_date_header() {
        let seen = httpdate("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let expected = humantime::parse_rfc3339("1994-11-06T08:49:37Z").unwrap();
        assert_eq!(seen, expected);
        assert_eq!(httpdate("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(httpdate("Sun, 06 Nov 1994 08:49:37 CET"), None);
    }
}

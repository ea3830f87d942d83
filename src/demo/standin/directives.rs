//! The `x-standin-*` test directives: request headers that script one response,
//! bypassing all session logic (see the module docs of [`crate::demo::standin`]).

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, SET_COOKIE};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;

use super::reply;

/// A response scripted by `x-standin-*` request headers.
pub(super) struct Script {
    status: StatusCode,
    cookies: Vec<HeaderValue>,
    headers: Vec<(HeaderName, HeaderValue)>,
    delay: Duration,
}

pub(super) fn scripted(headers: &HeaderMap) -> Option<Result<Script, String>> {
    let names = [
        "x-standin-status",
        "x-standin-set-cookie",
        "x-standin-header",
        "x-standin-delay-ms",
    ];
    names
        .iter()
        .any(|name| headers.contains_key(*name))
        .then(|| script(headers))
}

fn script(headers: &HeaderMap) -> Result<Script, String> {
    let number = |name: &str| -> Result<Option<u64>, String> {
        let Some(value) = headers.get(name) else {
            return Ok(None);
        };
        let text = value.to_str().unwrap_or("");
        text.trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}: {text:?} is not a number"))
    };
    let status = match number("x-standin-status")? {
        Some(n @ 200..=599) => StatusCode::from_u16(n as u16).map_err(|e| e.to_string())?,
        Some(n) => return Err(format!("x-standin-status: {n} is not a final status")),
        None => StatusCode::OK,
    };
    Ok(Script {
        status,
        cookies: headers
            .get_all("x-standin-set-cookie")
            .iter()
            .cloned()
            .collect(),
        headers: headers
            .get_all("x-standin-header")
            .iter()
            .map(extra_header)
            .collect::<Result<_, _>>()?,
        delay: Duration::from_millis(number("x-standin-delay-ms")?.unwrap_or(0)),
    })
}

/// `Name: value`, split at the first colon.
fn extra_header(raw: &HeaderValue) -> Result<(HeaderName, HeaderValue), String> {
    let bad = || format!("x-standin-header: {raw:?} is not `Name: value`");
    let (name, value) = raw.as_bytes().split_at(
        raw.as_bytes()
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(bad)?,
    );
    let name = HeaderName::from_bytes(name.trim_ascii()).map_err(|_| bad())?;
    let value = HeaderValue::from_bytes(value[1..].trim_ascii()).map_err(|_| bad())?;
    Ok((name, value))
}

impl Script {
    pub(super) async fn respond(self) -> Response<Full<Bytes>> {
        tokio::time::sleep(self.delay).await;
        let empty = matches!(self.status.as_u16(), 204 | 304);
        let body = if empty {
            String::new()
        } else {
            format!("scripted {}\n", self.status)
        };
        let mut response = reply(self.status, body);
        let headers = response.headers_mut();
        for cookie in self.cookies {
            headers.append(SET_COOKIE, cookie);
        }
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        response
    }
}

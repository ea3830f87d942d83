//! The ways a request can fail inside the gateway, and the one table that maps each
//! to the status a student sees.
//!
//! Messages are short, lowercase and generic on purpose: the body goes to a browser,
//! so it names the condition and never an upstream address, a session id or an
//! internal error chain. The detail is logged instead, once, where the error is made.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

/// The one literal behind [`RETRY_AFTER_SECS`]: a macro, because `concat!` (which
/// builds the 503 pages at compile time) takes literals, not constants.
macro_rules! retry_after_secs {
    () => {
        "10"
    };
}
pub(crate) use retry_after_secs;

/// The last words of every 503 page: when to come back, exactly as `Retry-After` says.
macro_rules! come_back {
    () => {
        concat!(
            "please try again in ",
            $crate::error::retry_after_secs!(),
            " seconds\n"
        )
    };
}
pub(crate) use come_back;

/// A request the gateway answers itself because it could not be proxied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayError {
    /// The path could be read two ways by PHP (encoded `/`, NUL, backslash, `..` above root).
    AmbiguousPath,
    /// `CONNECT`: the gateway is a reverse proxy, not a tunnel to anywhere.
    MethodNotAllowed,
    /// The student's upload paused longer than `timeouts.body_idle`.
    ClientTimeout,
    /// A streamed upload averaged less than `timeouts.upload_min_rate` over a window.
    UploadTooSlow,
    /// An upload still arriving after `timeouts.upload`.
    UploadTooLong,
    /// The upstream refused the connection, was unreachable, or did not accept it in time.
    UpstreamUnreachable,
    /// The upstream accepted the request but broke the exchange before a response head.
    UpstreamBroken,
    /// No response head arrived within `timeouts.response_headers`.
    UpstreamTimeout,
    /// No node may take the request: all down, draining or disabled.
    NoNodeAvailable,
    /// The data server, the only home of SCORM files, is down.
    DataServerDown,
    /// A request that can be read more than one way: no or two `Host` lines, both
    /// `Content-Length` and `chunked`, a broken chunked body.
    MalformedRequest,
    /// A `Host` not in `[site] hosts`.
    UnknownHost,
    /// The request head is over `max_header_bytes` or `max_headers`.
    HeadersTooLarge,
    /// The request target is over `max_uri_bytes`.
    UriTooLong,
    /// An HTTP version the listener does not speak: `HTTP/1.2`, `HTTP/2.0` in a
    /// request line, or HTTP/2's connection preface on a plain HTTP/1.1 port.
    VersionNotSupported,
    /// The body is over `max_body_bytes`.
    PayloadTooLarge,
    /// More requests in flight than `max_in_flight`.
    Overloaded,
    /// `surge.max_waiting` requests were waiting for a node already, none of a
    /// lower class than this one.
    LineFull,
    /// The request waited its class's patience (`surge.*patience`) for a node slot.
    WaitedTooLong,
    /// The data server's file export refused, was unreachable or broke off.
    FileExportUnreachable,
    /// The data server's file export did not answer within `response_headers`.
    FileExportTimeout,
    /// The data server's file export has no file at the path the node named.
    FileNotOnDataServer,
    /// The data server's file export answered something other than the file.
    FileExportFailed,
    /// A fetch from the file export failed while its probes say it is down: the
    /// student is told so, and nothing is logged for this file (the mark was).
    FileExportDown,
    /// A node named a file with `X-Accel-Redirect` that the gateway may not fetch
    /// (outside `offload.prefix`, `..`, an escape, a query), or without `[offload]`.
    UnusableAccelRedirect,
    /// The gateway could not open a connection for want of its own resources (open
    /// files, buffers, memory, local ports): its fault, not the upstream's.
    OutOfConnections,
}

impl GatewayError {
    /// The status table: one place, pinned by a test.
    pub fn status(self) -> StatusCode {
        match self {
            Self::AmbiguousPath => StatusCode::BAD_REQUEST,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::ClientTimeout | Self::UploadTooSlow | Self::UploadTooLong => {
                StatusCode::REQUEST_TIMEOUT
            }
            Self::UpstreamUnreachable | Self::UpstreamBroken => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::NoNodeAvailable
            | Self::DataServerDown
            | Self::Overloaded
            | Self::LineFull
            | Self::WaitedTooLong
            | Self::OutOfConnections => StatusCode::SERVICE_UNAVAILABLE,
            Self::MalformedRequest => StatusCode::BAD_REQUEST,
            Self::UnknownHost => StatusCode::MISDIRECTED_REQUEST,
            Self::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UriTooLong => StatusCode::URI_TOO_LONG,
            Self::VersionNotSupported => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::FileExportUnreachable
            | Self::FileExportFailed
            | Self::FileExportDown
            | Self::UnusableAccelRedirect => StatusCode::BAD_GATEWAY,
            Self::FileExportTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::FileNotOnDataServer => StatusCode::NOT_FOUND,
        }
    }

    /// The body a student sees: one line, no internals.
    pub fn message(self) -> &'static str {
        match self {
            Self::AmbiguousPath => "bad request: ambiguous path\n",
            Self::MethodNotAllowed => "method not allowed\n",
            Self::ClientTimeout => "request timeout: the upload stopped arriving\n",
            Self::UploadTooSlow => "request timeout: the upload arrived too slowly\n",
            Self::UploadTooLong => "request timeout: the upload took too long\n",
            Self::UpstreamUnreachable => "bad gateway: the moodle server could not be reached\n",
            Self::UpstreamBroken => "bad gateway: the moodle server closed the connection\n",
            Self::UpstreamTimeout => "gateway timeout: the moodle server did not answer in time\n",
            Self::NoNodeAvailable => {
                concat!(
                    "service unavailable: no moodle server can take this request right now; ",
                    come_back!()
                )
            }
            Self::DataServerDown => {
                concat!(
                    "service unavailable: the server with the course content is down; ",
                    come_back!()
                )
            }
            Self::MalformedRequest => "bad request\n",
            Self::UnknownHost => "misdirected request: this server does not serve that host\n",
            Self::HeadersTooLarge => "request header fields too large\n",
            Self::UriTooLong => "uri too long\n",
            Self::VersionNotSupported => {
                "http version not supported: this port speaks HTTP/1.1; HTTP/2 is offered over TLS only\n"
            }
            Self::PayloadTooLarge => "payload too large\n",
            Self::Overloaded => {
                concat!(
                    "service unavailable: too many requests right now; ",
                    come_back!()
                )
            }
            Self::LineFull => {
                concat!(
                    "service unavailable: too many students are waiting for the site right now; ",
                    come_back!()
                )
            }
            Self::WaitedTooLong => {
                concat!(
                    "service unavailable: the site is very busy and could not take your request in time; ",
                    come_back!()
                )
            }
            Self::FileExportUnreachable => {
                "bad gateway: the data server's file export could not be reached\n"
            }
            Self::FileExportTimeout => {
                "gateway timeout: the data server's file export did not answer in time\n"
            }
            Self::FileNotOnDataServer => "not found: the data server does not have this file\n",
            Self::FileExportFailed => "bad gateway: the data server's file export failed\n",
            Self::FileExportDown => {
                "bad gateway: the data server's file export is down; files come back when it does\n"
            }
            Self::UnusableAccelRedirect => {
                "bad gateway: the moodle server named a file the gateway may not fetch\n"
            }
            Self::OutOfConnections => {
                concat!(
                    "service unavailable: the gateway is out of connections; ",
                    come_back!()
                )
            }
        }
    }

    /// Whether the client connection must close after this answer: the rest of
    /// what it sent (an unread body, a request framed two ways) cannot be trusted
    /// to start a next request.
    pub fn closes_connection(self) -> bool {
        matches!(
            self,
            Self::MalformedRequest
                | Self::HeadersTooLarge
                | Self::UriTooLong
                | Self::VersionNotSupported
                | Self::PayloadTooLarge
                | Self::ClientTimeout
                | Self::UploadTooSlow
                | Self::UploadTooLong
        )
    }

    /// Whether the error says something about the upstream's health: it could not be
    /// reached (refused, unreachable, or not accepted within `timeouts.connect`). A
    /// slow answer does not count: a course backup or a big report legitimately takes
    /// longer than `response_headers`, and three of them in a row must not take a
    /// healthy node out (a hung node fails its probes instead). A broken exchange may
    /// be one bad response, and the gateway's own refusals and its own lack of
    /// resources ([`GatewayError::OutOfConnections`]) say nothing about any upstream.
    pub fn is_upstream_failure(self) -> bool {
        matches!(self, Self::UpstreamUnreachable)
    }
}

/// Seconds a client is told to wait after a 503: long enough for a probe round or a
/// restart, short enough that a student retrying soon gets in. The header and the
/// page text are both built from this one literal, so the page never says "in a
/// minute" beside a header that says 10 seconds.
pub(crate) const RETRY_AFTER_SECS: &str = retry_after_secs!();

impl GatewayError {
    /// The error page: plain text, never cached.
    pub fn response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from_static(self.message().as_bytes())));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        // An error page must never be cached by a browser or an intermediary.
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if self.status() == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        if self.closes_connection() {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl GatewayError {
    /// The same answer for the Moodle app, which reads JSON: a web service's error
    /// fields (`exception`, `errorcode`, `message`) and `login/token.php`'s
    /// (`error`), so the app shows the message instead of a broken answer; the
    /// status and `Retry-After` as in [`response`](Self::response).
    pub fn app_response(self) -> Response<Full<Bytes>> {
        let message = self.message().trim_end();
        let body = serde_json::json!({
            "exception": "moodle_exception",
            "errorcode": self.kind(),
            "message": message,
            "error": message,
        });
        let mut response = self.response();
        *response.body_mut() = Full::new(Bytes::from(body.to_string()));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        response
    }
}

/// How `/metrics` names each error.
impl GatewayError {
    /// The label of this error: snake case, stable, never a message.
    pub fn kind(self) -> &'static str {
        match self {
            Self::AmbiguousPath => "ambiguous_path",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::ClientTimeout => "client_timeout",
            Self::UploadTooSlow => "upload_too_slow",
            Self::UploadTooLong => "upload_too_long",
            Self::UpstreamUnreachable => "unreachable",
            Self::UpstreamBroken => "broken",
            Self::UpstreamTimeout => "timeout",
            Self::NoNodeAvailable => "no_node_available",
            Self::DataServerDown => "data_server_down",
            Self::MalformedRequest => "malformed_request",
            Self::UnknownHost => "unknown_host",
            Self::HeadersTooLarge => "headers_too_large",
            Self::UriTooLong => "uri_too_long",
            Self::VersionNotSupported => "version_not_supported",
            Self::PayloadTooLarge => "payload_too_large",
            Self::Overloaded => "overloaded",
            Self::LineFull => "line_full",
            Self::WaitedTooLong => "waited_too_long",
            Self::FileExportUnreachable => "file_export_unreachable",
            Self::FileExportTimeout => "file_export_timeout",
            Self::FileNotOnDataServer => "file_not_on_data_server",
            Self::FileExportFailed => "file_export_failed",
            Self::FileExportDown => "file_export_down",
            Self::UnusableAccelRedirect => "unusable_accel_redirect",
            Self::OutOfConnections => "out_of_connections",
        }
    }

    /// The configured limit that turned this request away, if one did: the key
    /// an operator would raise.
    pub fn limit(self) -> Option<&'static str> {
        match self {
            Self::HeadersTooLarge => Some("max_header_bytes"),
            Self::UriTooLong => Some("max_uri_bytes"),
            Self::PayloadTooLarge => Some("max_body_bytes"),
            Self::Overloaded => Some("max_in_flight"),
            Self::LineFull => Some("max_waiting"),
            Self::WaitedTooLong => Some("patience"),
            Self::ClientTimeout => Some("body_idle"),
            Self::UploadTooSlow => Some("upload_min_rate"),
            Self::UploadTooLong => Some("upload"),
            Self::OutOfConnections => Some("open_files"),
            _ => None,
        }
    }

    /// Whether an upstream, not the student or the gateway, failed this request.
    pub fn is_upstream_error(self) -> bool {
        matches!(
            self,
            Self::UpstreamUnreachable
                | Self::UpstreamBroken
                | Self::UpstreamTimeout
                | Self::FileExportUnreachable
                | Self::FileExportTimeout
                | Self::FileNotOnDataServer
                | Self::FileExportFailed
                | Self::FileExportDown
                | Self::UnusableAccelRedirect
        )
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message().trim_end())
    }
}

impl std::error::Error for GatewayError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_condition_has_its_status() {
        let table = [
            (GatewayError::AmbiguousPath, 400),
            (GatewayError::MethodNotAllowed, 405),
            (GatewayError::ClientTimeout, 408),
            (GatewayError::UploadTooSlow, 408),
            (GatewayError::UploadTooLong, 408),
            (GatewayError::UpstreamUnreachable, 502),
            (GatewayError::UpstreamBroken, 502),
            (GatewayError::UpstreamTimeout, 504),
            (GatewayError::NoNodeAvailable, 503),
            (GatewayError::DataServerDown, 503),
            (GatewayError::MalformedRequest, 400),
            (GatewayError::UnknownHost, 421),
            (GatewayError::HeadersTooLarge, 431),
            (GatewayError::UriTooLong, 414),
            (GatewayError::VersionNotSupported, 505),
            (GatewayError::PayloadTooLarge, 413),
            (GatewayError::Overloaded, 503),
            (GatewayError::LineFull, 503),
            (GatewayError::WaitedTooLong, 503),
            (GatewayError::FileExportUnreachable, 502),
            (GatewayError::FileExportTimeout, 504),
            (GatewayError::FileNotOnDataServer, 404),
            (GatewayError::FileExportFailed, 502),
            (GatewayError::FileExportDown, 502),
            (GatewayError::UnusableAccelRedirect, 502),
            (GatewayError::OutOfConnections, 503),
        ];
        for (error, status) in table {
            assert_eq!(error.status().as_u16(), status, "{error:?}");
            assert!(error.message().ends_with('\n'));
        }
        let own = GatewayError::OutOfConnections.message();
        assert!(own.starts_with("service unavailable: the gateway is out of connections"));
    }

    #[test]
    fn error_page_is_plain_and_uncached() {
        let response = GatewayError::UpstreamTimeout.response();
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(response.headers()[header::CACHE_CONTROL], "no-store");
        assert!(response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain"));
        assert!(!response.headers().contains_key(header::RETRY_AFTER));
        assert!(!response.headers().contains_key(header::CONNECTION));
    }

    #[test]
    fn framing_errors_close_the_connection() {
        let response = GatewayError::MalformedRequest.response();
        assert_eq!(response.headers()[header::CONNECTION], "close");
    }

    #[test]
    fn unavailable_pages_say_when_to_come_back() {
        let unavailable = [
            GatewayError::NoNodeAvailable,
            GatewayError::DataServerDown,
            GatewayError::Overloaded,
            GatewayError::LineFull,
            GatewayError::WaitedTooLong,
            GatewayError::OutOfConnections,
        ];
        for error in unavailable {
            let response = error.response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers()[header::RETRY_AFTER], "10");
            let app = error.app_response();
            assert_eq!(app.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(app.headers()[header::RETRY_AFTER], "10");
            assert_eq!(
                app.headers()[header::CONTENT_TYPE],
                "application/json; charset=utf-8"
            );
            let page = error.message();
            assert!(page.ends_with("please try again in 10 seconds\n"), "{page}");
        }
    }
}

//! Entry points into this side for the fuzz targets (`fuzz/`) and the differential
//! tests (`tests/differential.rs`, `tests/it/writer.rs`), which must feed it bytes
//! without a listener in front. Hidden from the docs: not for the gateway's use.

use std::convert::Infallible;

use bytes::BytesMut;
use http::{Request, Response};

use super::{parse, serve, Ended, Limits, Parsed, Start, StudentBody};
use crate::http::h1::stopping::Stopping;

/// What the request head parser made of the bytes at the start of a connection.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // One per input, never stored.
pub enum RequestRead {
    /// The head is not complete yet.
    Partial,
    /// Read by this side: the request with every header line in its map, the
    /// length of its body (0 for none), whether the connection may carry another
    /// request, and how many bytes the head took.
    Head {
        /// The request line and every header line.
        request: Request<()>,
        /// The body's `Content-Length`, 0 for none.
        body_len: u64,
        /// The connection may carry another request after this one.
        keep_alive: bool,
        /// The head's length in bytes.
        consumed: usize,
    },
    /// Left to hyper's server, which answers it.
    ForHyper,
    /// Refused by this side with this status, the connection closed (a request
    /// framed two ways).
    Refused(u16),
}

/// Parses `bytes` as the first read of a connection with `max_headers` as
/// `limits.max_headers`.
pub fn parse_request(bytes: &[u8], max_headers: usize) -> RequestRead {
    let mut buf = BytesMut::from(bytes);
    match parse(&mut buf, max_headers, &mut Vec::new(), &mut None) {
        Parsed::Partial => RequestRead::Partial,
        Parsed::ForHyper | Parsed::ForHyperFrom(_) => RequestRead::ForHyper,
        Parsed::Refuse(error) => RequestRead::Refused(error.status().as_u16()),
        Parsed::Head(head) => RequestRead::Head {
            request: head.request,
            body_len: head.body_len,
            keep_alive: head.keep_alive,
            consumed: bytes.len() - buf.len(),
        },
    }
}

/// Serves one connection on this side, as the students' listener does, each
/// request answered by `answer`; `false` when a request was handed over to hyper
/// (the caller's to serve with the bytes read so far, which this drops).
pub async fn serve_connection<F>(io: tokio::net::TcpStream, mut answer: F) -> bool
where
    F: FnMut(Request<StudentBody>) -> Response<axum::body::Body>,
{
    let limits = Limits {
        request_headers: std::time::Duration::from_secs(10),
        keep_alive: std::time::Duration::from_secs(75),
        max_headers: 100,
        head_bytes: 16 * 1024,
    };
    let mut service =
        tower::service_fn(move |request| std::future::ready(Ok::<_, Infallible>(answer(request))));
    let mut stop = std::pin::pin!(std::future::pending::<()>());
    let mut stopping = Stopping::new(stop.as_mut());
    matches!(
        serve(
            Start::New(Box::new(io)),
            &mut service,
            &limits,
            &mut stopping
        )
        .await,
        Ended::Closed
    )
}

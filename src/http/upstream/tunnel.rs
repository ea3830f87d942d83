//! Upgraded connections (WebSocket only): passed through to the node, and turned
//! into a byte tunnel only once the node said `101`.
//!
//! Why WebSocket only: once a connection is a tunnel the gateway no longer sees
//! requests in it, so every edge rule (methods, one known Host, the SCORM route to
//! the data server, the forwarding headers) is gone for whatever follows. WebSocket
//! is the one upgrade a browser (and Moodle's real-time plugins) makes; `h2c` is
//! what request-tunnelling tools use to reach a loosely configured node with raw
//! HTTP/2. Any other `Upgrade` is removed as the hop-by-hop header it is, and the
//! request goes on as a plain one.
//!
//! Why its own connection to the node: an upgrade request leaves the connection
//! in a state only the node knows. If the node refuses (answers anything but
//! `101`), the answer is forwarded as plain HTTP and that connection is closed
//! rather than pooled, so no later request can land on a half-switched socket.
//! Why an idle limit: a tunnel holds a connection on both sides, and a peer that
//! vanished without a FIN would hold them for ever; `timeouts.tunnel_idle` of
//! silence in both directions ends it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::http::h1::server::StudentBody;
use crate::http::h1::wire::has_token;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::GatewayError;
use crate::http::body::IdleLimited;
use crate::http::upstream::fault::ConnectFault;
use crate::http::upstream::pool::NodeBody;
use crate::http::upstream::proxy::{self, Bounds, Peer, Target};
use crate::http::upstream::upload::Upload;

/// Whether the request asks to switch to WebSocket and its connection can. Only
/// hyper's server can switch one, and it leaves an `OnUpgrade` in each request that
/// asks (the gateway's own HTTP/1.1 hands any request with `Upgrade` to it): looked
/// for first, it spares every other request two header lookups.
pub fn is_upgrade<B>(request: &Request<B>) -> bool {
    request
        .extensions()
        .get::<hyper::upgrade::OnUpgrade>()
        .is_some()
        && asks_for_websocket(request)
}

/// Whether the request asks to switch to WebSocket: `Connection: upgrade` (as one
/// token of the list) and `websocket` among the `Upgrade` tokens, on HTTP/1.1.
fn asks_for_websocket<B>(request: &Request<B>) -> bool {
    request.version() == http::Version::HTTP_11
        && request
            .headers()
            .get_all(header::UPGRADE)
            .iter()
            .any(|v| has_token(v.as_bytes(), WEBSOCKET.as_bytes()))
        && request
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .any(|v| has_token(v.as_bytes(), b"upgrade"))
}

/// The one protocol a connection may switch to.
const WEBSOCKET: &str = "websocket";

/// Sends an upgrade request to `upstream` on a connection of its own and returns
/// the node's answer. On `101` the two connections are joined in the background
/// until either side closes or both are silent for `bounds.tunnel_idle`.
pub async fn forward(
    target: Target<'_>,
    mut request: Request<StudentBody>,
    peer: Peer<'_>,
    bounds: Bounds,
) -> Result<Response<IdleLimited<NodeBody>>, GatewayError> {
    let (connect, idle) = (bounds.connect, bounds.tunnel_idle);
    let (name, upstream) = (target.name, target.authority);
    let client_side = hyper::upgrade::on(&mut request);
    // The body (if any) under the same size and pause limits as any upload.
    let mut request =
        request.map(|body| Upload::new(body, &bounds).into_request_body(bounds.max_body_bytes));
    proxy::prepare(upstream, &mut request, peer);
    // The hop-by-hop pair that asks for the switch goes back on after the header
    // hygiene removed it: WebSocket alone, whatever else the client listed.
    let headers = request.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(WEBSOCKET));
    let stream = tokio::time::timeout(connect, TcpStream::connect(upstream.as_str()))
        .await
        .map_err(|_| GatewayError::UpstreamUnreachable)?
        .map_err(|error| connect_failed(name, &error))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| GatewayError::UpstreamBroken)?;
    tokio::spawn(connection.with_upgrades());
    let answer = tokio::time::timeout(bounds.response_headers, sender.send_request(request));
    let mut response = match answer.await {
        Err(_) => return Err(GatewayError::UpstreamTimeout),
        Ok(Err(_)) => return Err(GatewayError::UpstreamBroken),
        Ok(Ok(response)) => response,
    };
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        proxy::strip_hop_by_hop(response.headers_mut());
        return Ok(
            response.map(|body| IdleLimited::new(NodeBody::detached(body), bounds.body_idle))
        );
    }
    // A node that switches to anything but WebSocket gets no tunnel: its answer
    // would be a raw channel the edge rules never see.
    let switched_to = response.headers().get(header::UPGRADE);
    if !switched_to.is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(WEBSOCKET.as_bytes())) {
        tracing::warn!(
            upstream = %name,
            "the node switched to another protocol than websocket: refused"
        );
        return Err(GatewayError::UpstreamBroken);
    }
    let node_side = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        match tokio::try_join!(client_side, node_side) {
            Ok((client, node)) => join(TokioIo::new(client), TokioIo::new(node), idle).await,
            Err(error) => tracing::debug!("upgrade did not complete: {error}"),
        }
    });
    proxy::strip_hop_by_hop(response.headers_mut());
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(WEBSOCKET));
    Ok(response.map(|body| IdleLimited::new(NodeBody::detached(body), bounds.body_idle)))
}

/// The status for an upgrade whose node connection could not be opened: the
/// gateway's own lack of resources is a 503 and no mark against the node.
fn connect_failed(upstream: &str, error: &std::io::Error) -> GatewayError {
    let fault = ConnectFault::of(error);
    match fault {
        ConnectFault::Gateway => tracing::warn!(
            upstream = %upstream,
            "upgrade: the gateway is out of connections (its own limit, not the upstream's fault): {error}"
        ),
        ConnectFault::Refused | ConnectFault::Upstream => {
            tracing::warn!(upstream = %upstream, "upgrade: upstream unreachable: {error}")
        }
    }
    fault.error()
}

/// Copies bytes both ways until one side closes, an error, or `idle` passes with
/// no byte in either direction.
async fn join<A, B>(client: A, node: B, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut node_read, mut node_write) = tokio::io::split(node);
    let last = Arc::new(AtomicU64::new(0));
    let start = tokio::time::Instant::now();
    let up = pump(&mut client_read, &mut node_write, &last, start, idle);
    let down = pump(&mut node_read, &mut client_write, &last, start, idle);
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// One direction of a tunnel. A read that waits `idle` ends the tunnel unless the
/// other direction moved meanwhile (`last`, milliseconds since `start`).
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    last: &AtomicU64,
    start: tokio::time::Instant,
    idle: Duration,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = match tokio::time::timeout(idle, from.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => n,
            Err(_) => {
                let quiet = start.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
                if u128::from(quiet) >= idle.as_millis() {
                    tracing::debug!("tunnel idle for {idle:?}: closed");
                    break;
                }
                continue;
            }
        };
        if to.write_all(&buffer[..read]).await.is_err() || to.flush().await.is_err() {
            break;
        }
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(upgrade: &str, connection: &str) -> Request<()> {
        Request::get("/chat")
            .header(header::UPGRADE, upgrade)
            .header(header::CONNECTION, connection)
            .body(())
            .unwrap()
    }

    #[test]
    fn only_websocket_is_an_upgrade() {
        let asks = |upgrade, connection| asks_for_websocket(&request(upgrade, connection));
        assert!(asks("websocket", "Upgrade"));
        assert!(asks("WebSocket", "keep-alive, upgrade"));
        assert!(asks("foo/1, websocket", "upgrade"));
        for other in ["h2c", "HTTP/2.0", "TLS/1.2", "echo", "websocketx", ""] {
            assert!(!asks(other, "Upgrade"), "{other}");
        }
        assert!(!asks("websocket", "keep-alive"));
    }

    #[test]
    fn a_request_whose_connection_cannot_switch_is_no_upgrade() {
        assert!(!is_upgrade(&request("websocket", "Upgrade")));
    }
}

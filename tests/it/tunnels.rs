//! Upgraded connections (WebSocket and friends) through the gateway, against a raw
//! node that speaks the upgrade by hand.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use std::path::Path;

use moodle_gateway::Config;

use crate::support::{self, config_for, TestGateway};

/// A loose node: it answers any upgrade to 101 (switching to whatever protocol was
/// asked for, `h2c` included) and then echoes every byte, except on `/refuse`; and
/// anything else with a plain 200 and `Connection: keep-alive` (it still closes
/// after one answer: the gateway must not pool that connection anyway). Counts the
/// connections it accepted and keeps every request head.
async fn echo_node() -> (std::net::SocketAddr, Arc<AtomicUsize>, Heads) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let heads = Heads::default();
    let (count, seen) = (accepted.clone(), heads.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::Relaxed);
            let seen = seen.clone();
            tokio::spawn(async move {
                let head = read_head(&mut stream).await;
                let lower = head.to_ascii_lowercase();
                seen.lock().unwrap().push(lower.clone());
                let protocol = lower
                    .lines()
                    .find_map(|line| line.strip_prefix("upgrade: "))
                    .map(str::to_owned);
                match protocol {
                    Some(protocol) if !lower.starts_with("get /refuse") => {
                        let switch = format!("HTTP/1.1 101 Switching Protocols\r\nUpgrade: {protocol}\r\nConnection: Upgrade\r\n\r\n");
                        stream.write_all(switch.as_bytes()).await.unwrap();
                        let mut buffer = [0u8; 1024];
                        while let Ok(n) = stream.read(&mut buffer).await {
                            if n == 0 || stream.write_all(&buffer[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                    _ => {
                        let plain =
                            "HTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-Upstream: web1\r\n\r\nno thank";
                        stream.write_all(plain.as_bytes()).await.unwrap();
                    }
                }
            });
        }
    });
    (addr, accepted, heads)
}

/// Every request head an [`echo_node`] read, lowercased.
type Heads = Arc<std::sync::Mutex<Vec<String>>>;

async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

async fn gateway(node: std::net::SocketAddr, tunnel_idle: Option<Duration>) -> TestGateway {
    let data = support::named_upstream("data").await;
    let text = config_for(&[node], data, "state.file = \"\"");
    let mut config = Config::parse(&text, Path::new("."), Default::default()).unwrap();
    if let Some(idle) = tunnel_idle {
        config.timeouts.tunnel_idle = idle;
    }
    TestGateway::start_with(config).await
}

const UPGRADE: &str = "GET /chat HTTP/1.1\r\nHost: moodle.example.edu\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";

#[tokio::test]
async fn an_upgrade_becomes_a_tunnel_once_the_node_says_101() {
    let (node, _, heads) = echo_node().await;
    let gateway = gateway(node, None).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    let claimed = UPGRADE.replace("\r\n\r\n", "\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n");
    client.write_all(claimed.as_bytes()).await.unwrap();
    let head = read_head(&mut client).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
    for message in ["hello", "and again"] {
        client.write_all(message.as_bytes()).await.unwrap();
        let mut echoed = vec![0u8; message.len()];
        client.read_exact(&mut echoed).await.unwrap();
        assert_eq!(echoed, message.as_bytes());
    }
    // The node learns who asked, once, as for any request.
    let head = heads.lock().unwrap()[0].clone();
    let forwarding: Vec<&str> = head
        .lines()
        .filter(|line| line.starts_with("x-forwarded-"))
        .collect();
    assert_eq!(
        forwarding,
        [
            "x-forwarded-for: 127.0.0.1",
            "x-forwarded-proto: http",
            "x-forwarded-host: moodle.example.edu"
        ],
        "{head}"
    );
}

#[tokio::test]
async fn a_refused_upgrade_stays_http_on_a_connection_never_reused() {
    let (node, accepted, _) = echo_node().await;
    let gateway = gateway(node, None).await;
    let refused =
        "GET /refuse HTTP/1.1\r\nHost: m\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client.write_all(refused.as_bytes()).await.unwrap();
    let head = read_head(&mut client).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut body = [0u8; 8];
    client.read_exact(&mut body).await.unwrap();
    assert_eq!(&body, b"no thank");
    // A plain request afterwards goes over a connection of the pool, not that one.
    let seen = support::get(&gateway.url("/course/view.php")).await;
    assert_eq!(seen.status, 200);
    assert_eq!(
        accepted.load(Ordering::Relaxed),
        2,
        "the upgrade had its own connection"
    );
}

#[tokio::test]
async fn a_silent_tunnel_is_closed_after_tunnel_idle() {
    let (node, _, _) = echo_node().await;
    let idle = Duration::from_millis(300);
    let gateway = gateway(node, Some(idle)).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    // Before the upgrade is sent, so the tunnel's idle clock starts after this one.
    let started = std::time::Instant::now();
    client.write_all(UPGRADE.as_bytes()).await.unwrap();
    assert!(read_head(&mut client).await.starts_with("HTTP/1.1 101"));
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(5), client.read(&mut byte)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "closed by the gateway: {closed:?}"
    );
    // Closed because it idled, not at once for some other reason.
    assert!(
        started.elapsed() >= idle,
        "closed after {:?}",
        started.elapsed()
    );
}

/// What h2csmuggler sends: an HTTP/1.1 request asking to switch to cleartext HTTP/2.
const H2C: &str = "GET /course/view.php HTTP/1.1\r\nHost: moodle.example.edu\r\n\
    Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";

#[tokio::test]
async fn an_h2c_upgrade_never_reaches_the_node_and_the_request_stays_plain_http() {
    let (node, _, heads) = echo_node().await;
    let gateway = gateway(node, None).await;
    for upgrade in [H2C.to_owned(), H2C.replace("h2c", "TLS/1.2, h2c")] {
        let mut client = TcpStream::connect(gateway.addr).await.unwrap();
        client.write_all(upgrade.as_bytes()).await.unwrap();
        let head = read_head(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let mut body = [0u8; 8];
        client.read_exact(&mut body).await.unwrap();
        assert_eq!(&body, b"no thank");
        // The connection is still the gateway's: its edge rules apply to what follows.
        let trace = "TRACE / HTTP/1.1\r\nHost: moodle.example.edu\r\n\r\n";
        client.write_all(trace.as_bytes()).await.unwrap();
        let head = read_head(&mut client).await;
        assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    }
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    for head in heads {
        assert!(!head.contains("upgrade"), "the node saw {head}");
        assert!(!head.contains("http2-settings"), "the node saw {head}");
    }
}

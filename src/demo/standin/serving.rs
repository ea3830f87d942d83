//! Serving one stand-in's port: the accept loop, and closing and rebinding the port so a
//! node's web server can die and come back on the same address.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{handle, Inner};

/// How often, and how long apart, a rebind that fails with `AddrInUse` is retried.
/// Short on purpose: `restart` is synchronous, so the pause blocks the caller's thread.
const REBIND_TRIES: u32 = 10;
const REBIND_PAUSE: Duration = Duration::from_millis(20);

/// The listening socket, shared by the accept loop and [`Serving`]. Stopping takes the
/// socket out and drops it on the stopping thread, so the port is closed when `stop`
/// returns, not whenever the accept task next runs: `restart` is synchronous and must
/// rebind at once, and on a current-thread runtime it could never wait for that task.
type Port = Arc<Mutex<Option<TcpListener>>>;

/// One run of a stand-in's server, from bind to stop. Dropping it is stopping it.
pub(super) struct Serving {
    port: Port,
    stop: watch::Sender<bool>,
}

impl Serving {
    /// Serves `listener` in the background. Call inside a Tokio runtime.
    pub(super) fn start(listener: std::net::TcpListener, inner: Arc<Inner>) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        let port = Arc::new(Mutex::new(Some(TcpListener::from_std(listener)?)));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(accept(port.clone(), inner, stopped));
        Ok(Serving { port, stop })
    }
}

impl Drop for Serving {
    /// Closes the port now (pending connections in its backlog are reset) and tells
    /// every connection of this run to drop, as if the node's process died.
    fn drop(&mut self) {
        drop(lock(&self.port).take());
        self.stop.send_replace(true);
    }
}

/// Binds `addr` again after a stop. std sets `SO_REUSEADDR` on Unix, so the old run's
/// connections lingering in `TIME_WAIT` do not block it. `AddrInUse` can still happen
/// if the OS handed the free port to some other socket meanwhile (ports are shared
/// with outgoing connections); that is retried briefly, then reported.
pub(super) fn rebind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let mut tries = 1;
    loop {
        match std::net::TcpListener::bind(addr) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < REBIND_TRIES => {
                tries += 1;
                std::thread::sleep(REBIND_PAUSE);
            }
            bound => return bound,
        }
    }
}

fn lock(port: &Port) -> MutexGuard<'_, Option<TcpListener>> {
    port.lock().unwrap_or_else(|p| p.into_inner())
}

/// Resolves when this run is stopped (the flag is set or the sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|&stopped| stopped).await;
}

/// The next connection, or `None` once the port is closed. The lock is held only
/// inside one poll, never across an `.await`.
async fn next(port: &Port) -> Option<io::Result<TcpStream>> {
    std::future::poll_fn(|cx| match lock(port).as_ref() {
        Some(listener) => listener.poll_accept(cx).map(|r| Some(r.map(|(s, _)| s))),
        None => Poll::Ready(None),
    })
    .await
}

async fn accept(port: Port, inner: Arc<Inner>, stop: watch::Receiver<bool>) {
    loop {
        let stream = tokio::select! {
            accepted = next(&port) => match accepted {
                Some(Ok(stream)) => stream,
                // Out of file descriptors and the like: the node is alive, wait a bit.
                Some(Err(_)) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                None => return,
            },
            () = stopped(stop.clone()) => return,
        };
        let _ = stream.set_nodelay(true);
        let (inner, stop) = (inner.clone(), stop.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |r| handle(inner.clone(), r));
            let http = hyper::server::conn::http1::Builder::new();
            let connection = http.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                () = stopped(stop) => {}
            }
        });
    }
}

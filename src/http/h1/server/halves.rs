//! A student's connection in two halves: the read side travels with a request's
//! body into the stack, the write side stays to answer. tokio's `split` does the
//! same, with one mutex locked for each call (contended only if a request's body
//! were read from another task while its answer is written); these halves also let
//! the answer reach the socket itself, to splice a large body into it
//! ([`crate::http::body::splice`]).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::StudentIo;
use crate::http::body::stall::WriteStall;

type Shared = Arc<Mutex<StudentIo>>;

/// `io` in two halves.
pub(super) fn split(io: StudentIo) -> (ReadHalf, WriteHalf) {
    let shared = Arc::new(Mutex::new(io));
    (ReadHalf(shared.clone()), WriteHalf(shared))
}

fn lock(shared: &Shared) -> MutexGuard<'_, StudentIo> {
    // Nothing panics while holding it; if something did, the socket is still whole.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The read side.
pub(super) struct ReadHalf(Shared);

/// The write side.
pub(super) struct WriteHalf(Shared);

impl ReadHalf {
    /// The connection whole again; `None` if `write` is another connection's.
    pub(super) fn unsplit(self, write: WriteHalf) -> Option<StudentIo> {
        if !Arc::ptr_eq(&self.0, &write.0) {
            return None;
        }
        drop(write);
        Arc::into_inner(self.0).map(|io| io.into_inner().unwrap_or_else(PoisonError::into_inner))
    }
}

impl WriteHalf {
    /// Runs `f` on the socket when the connection is plain TCP (a splice can
    /// write into it); `None` over TLS.
    pub(super) fn with_tcp<R>(
        &mut self,
        f: impl FnOnce(&mut WriteStall<TcpStream>) -> R,
    ) -> Option<R> {
        let mut io = lock(&self.0);
        let io: &mut dyn std::any::Any = &mut **io;
        io.downcast_mut::<WriteStall<TcpStream>>().map(f)
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut **lock(&self.0)).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut **lock(&self.0)).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut **lock(&self.0)).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        lock(&self.0).is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut **lock(&self.0)).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut **lock(&self.0)).poll_shutdown(cx)
    }
}

//! Where the gateway's HTTP/1.1 side meets hyper's server: a connection handed
//! over with the bytes already read ([`Replayed`]), and the students' stack as a
//! service hyper can call ([`FromHyper`]). The listener runs hyper's HTTP/1.1 on a
//! handed-over connection and its HTTP/2 with these two.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::{Request, Response};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http::h1::server::{StudentBody, StudentIo};

/// A connection handed to hyper: the bytes this side read and did not use come
/// first, then the socket.
pub(crate) struct Replayed {
    read: Bytes,
    io: StudentIo,
}

impl Replayed {
    pub(crate) fn new(read: Bytes, io: StudentIo) -> Self {
        Self { read, io }
    }

    /// The connection behind the bytes read.
    pub(crate) fn io_mut(&mut self) -> &mut StudentIo {
        &mut self.io
    }
}

impl AsyncRead for Replayed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.read.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.read.len().min(buf.remaining());
        buf.put_slice(&self.read[..n]);
        self.read.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Replayed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A service for this side as a service for hyper's server, which hands it
/// hyper's bodies and calls through `&self`: a clone of the service per request,
/// made ready and called (as `hyper_util`'s glue does).
#[derive(Clone)]
pub(crate) struct FromHyper<S>(pub S);

impl<S, B> hyper::service::Service<Request<Incoming>> for FromHyper<S>
where
    S: tower::Service<Request<StudentBody>, Response = Response<B>> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tower::util::Oneshot<S, Request<StudentBody>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        tower::util::Oneshot::new(self.0.clone(), request.map(StudentBody::hyper))
    }
}

//! A client that stops reading: the write side of a student's connection may wait
//! for the student at most `timeouts.body_idle`, then the connection is cut.
//!
//! Why: a browser that stops reading a download (a tab suspended, a phone that lost
//! its signal without a FIN) leaves the gateway's writes pending for ever, and with
//! them the node's connection and a PHP worker streaming the file. The bodies'
//! own idle limit ([`crate::http::body::IdleLimited`]) only watches the *node's* pauses;
//! this watches the student's. The timer is armed only while a write is actually
//! blocked, so a connection whose writes go straight into the socket buffer never
//! touches the timer wheel.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `inner` with a limit on how long one write may stay blocked.
#[derive(Debug)]
pub struct WriteStall<S> {
    inner: S,
    limit: Duration,
    /// Allocated at the first blocked write and reset after.
    timer: Option<Pin<Box<Sleep>>>,
    blocked: bool,
}

impl<S> WriteStall<S> {
    /// Wraps `inner`; a write blocked for `limit` fails with `TimedOut`.
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: None,
            blocked: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Called with the outcome of a write or flush: clears the clock when it made
    /// progress, starts or checks it when it is blocked.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if outcome.is_ready() {
            self.blocked = false;
            return outcome;
        }
        if !self.blocked {
            self.blocked = true;
            let deadline = Instant::now() + self.limit;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let timer = self.timer.as_mut().expect("armed above");
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading for longer than timeouts.body_idle",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStall<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStall<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, outcome)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, outcome)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_reader_never_takes_fails_after_the_limit() {
        // A 64-byte pipe nobody reads: the second write blocks.
        let (writer, _reader) = tokio::io::duplex(64);
        let mut stalled = WriteStall::new(writer, Duration::from_secs(60));
        stalled.write_all(&[0u8; 64]).await.unwrap();
        let started = Instant::now();
        let error = stalled.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_keeps_up_is_never_cut() {
        let (writer, mut reader) = tokio::io::duplex(64);
        let mut stalled = WriteStall::new(writer, Duration::from_secs(1));
        let drain = tokio::spawn(async move {
            let mut sink = Vec::new();
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mut chunk = [0u8; 64];
                let n = tokio::io::AsyncReadExt::read(&mut reader, &mut chunk)
                    .await
                    .unwrap();
                sink.extend_from_slice(&chunk[..n]);
            }
            sink.len()
        });
        for _ in 0..50 {
            stalled.write_all(&[1u8; 64]).await.unwrap();
        }
        drop(stalled);
        assert!(drain.await.unwrap() >= 50 * 64 - 64);
    }
}

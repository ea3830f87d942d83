//! An answer compressed on its way to the student, as it streams: gzip or brotli,
//! never the whole body held (memory stays at the encoder's window and one
//! output piece, whatever the answer's size).
//!
//! When bytes go out: whenever the encoder has output, and whenever the node's body
//! makes the student wait (its next frame is not there yet) while input is still
//! inside the encoder, which is then flushed (a sync flush: a few bytes, the window
//! kept). So a page Moodle sends in pieces (`core_shutdown_manager` flushing a long
//! report, a long poll that answers late) reaches the browser piece by piece, as it
//! would uncompressed; nothing waits for a buffer to fill.
//!
//! Which answers are compressed, and what their headers become, is [`rules`].

use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::buf::Writer;
use bytes::{BufMut, Bytes, BytesMut};
use flate2::write::GzEncoder;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::splice::{PassThrough, Splice};
use super::BoxError;

pub mod rules;

pub use rules::{Coding, Rules};

/// Brotli's window: 256 KiB (`lgwin` 18) rather than its default 4 MiB, which every
/// answer being compressed would hold until its student has read it all.
const BROTLI_WINDOW: u32 = 18;
/// Brotli's input buffer.
const BROTLI_BUFFER: usize = 4096;

/// A body passed on as it is, or compressed on its way.
pub struct Compressed<B> {
    inner: B,
    state: State,
}

enum State {
    /// Passed on as it is (no allocation for the answers that are not compressed).
    Plain,
    Encoding {
        encoder: Box<Encoder>,
        /// Input given to the encoder since its last flush.
        unflushed: bool,
    },
    /// The body's trailers, after its last data.
    Trailers(Option<HeaderMap>),
    Done,
}

impl<B> std::fmt::Debug for Compressed<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Plain => "plain",
            State::Encoding { .. } => "encoding",
            State::Trailers(_) | State::Done => "ended",
        };
        f.debug_struct("Compressed").field("state", &state).finish()
    }
}

/// One answer's encoder, writing into the output the body sends next.
enum Encoder {
    Gzip(GzEncoder<Writer<BytesMut>>),
    Brotli(Box<brotli::CompressorWriter<Writer<BytesMut>>>),
}

impl Encoder {
    fn new(coding: Coding, level: u32) -> Self {
        let sink = BytesMut::new().writer();
        match coding {
            Coding::Gzip => Self::Gzip(GzEncoder::new(sink, flate2::Compression::new(level))),
            Coding::Brotli => Self::Brotli(Box::new(brotli::CompressorWriter::new(
                sink,
                BROTLI_BUFFER,
                level,
                BROTLI_WINDOW,
            ))),
        }
    }

    fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Self::Gzip(gzip) => gzip.write_all(data),
            Self::Brotli(brotli) => brotli.write_all(data),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Gzip(gzip) => gzip.flush(),
            Self::Brotli(brotli) => brotli.flush(),
        }
    }

    /// The output so far, taken.
    fn output(&mut self) -> Bytes {
        let sink = match self {
            Self::Gzip(gzip) => gzip.get_mut(),
            Self::Brotli(brotli) => brotli.get_mut(),
        };
        sink.get_mut().split().freeze()
    }

    /// The last output: the stream closed.
    fn finish(self) -> std::io::Result<Bytes> {
        let sink = match self {
            Self::Gzip(gzip) => gzip.finish()?,
            Self::Brotli(brotli) => brotli.into_inner(),
        };
        Ok(sink.into_inner().freeze())
    }
}

impl<B> Compressed<B> {
    /// `inner`, passed on as it is.
    pub fn plain(inner: B) -> Self {
        Self {
            inner,
            state: State::Plain,
        }
    }

    /// `inner`, compressed in `coding` at `level` (gzip 1..9, brotli's quality).
    pub fn new(inner: B, coding: Coding, level: u32) -> Self {
        Self {
            inner,
            state: State::Encoding {
                encoder: Box::new(Encoder::new(coding, level)),
                unflushed: false,
            },
        }
    }

    /// The encoder's input has ended: its last output, and the trailers after it.
    fn end(&mut self, trailers: Option<HeaderMap>) -> Result<Option<Frame<Bytes>>, BoxError> {
        let state = std::mem::replace(&mut self.state, State::Trailers(trailers));
        let State::Encoding { encoder, .. } = state else {
            return Ok(None);
        };
        let last = encoder.finish()?;
        Ok((!last.is_empty()).then(|| Frame::data(last)))
    }
}

impl<B> Body for Compressed<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let (encoder, unflushed) = match &mut this.state {
                State::Plain => {
                    return Pin::new(&mut this.inner).poll_frame(cx).map_err(Into::into)
                }
                State::Encoding { encoder, unflushed } => (encoder, unflushed),
                State::Trailers(trailers) => {
                    let trailers = trailers.take();
                    this.state = State::Done;
                    return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
                }
                State::Done => return Poll::Ready(None),
            };
            let polled = Pin::new(&mut this.inner).poll_frame(cx);
            let output = match polled {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        *unflushed = true;
                        encoder.write(&data).map(|()| encoder.output())
                    }
                    Err(frame) => match this.end(frame.into_trailers().ok()) {
                        Ok(Some(last)) => return Poll::Ready(Some(Ok(last))),
                        Ok(None) => continue,
                        Err(error) => Err(std::io::Error::other(error)),
                    },
                },
                Poll::Ready(None) => match this.end(None) {
                    Ok(Some(last)) => return Poll::Ready(Some(Ok(last))),
                    Ok(None) => continue,
                    Err(error) => Err(std::io::Error::other(error)),
                },
                Poll::Ready(Some(Err(error))) => {
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(error.into())));
                }
                // The student would wait for the node: send what the encoder holds.
                Poll::Pending if *unflushed => {
                    *unflushed = false;
                    match encoder.flush().map(|()| encoder.output()) {
                        Ok(output) if output.is_empty() => return Poll::Pending,
                        other => other,
                    }
                }
                Poll::Pending => return Poll::Pending,
            };
            match output {
                Ok(output) if output.is_empty() => continue,
                Ok(output) => return Poll::Ready(Some(Ok(Frame::data(output)))),
                Err(error) => {
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(error.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self.state {
            State::Plain => self.inner.is_end_stream(),
            State::Done | State::Trailers(None) => true,
            _ => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Plain => self.inner.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

impl<B: Splice + Unpin> PassThrough for Compressed<B> {
    type Inner = B;

    fn inner(&self) -> &B {
        &self.inner
    }

    fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Only as it is: compressing needs the bytes.
    fn passing(&self) -> bool {
        matches!(self.state, State::Plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::body::inflate::Inflated;
    use http_body_util::{BodyExt, Full, StreamBody};
    use std::io::Read;

    fn page() -> Bytes {
        Bytes::from("<html><body>".to_owned() + &"<p>Course 101</p>".repeat(2000))
    }

    #[tokio::test]
    async fn gzip_and_brotli_give_back_the_same_bytes() {
        let gzip = Compressed::new(Full::new(page()), Coding::Gzip, 5);
        let gzip = gzip.collect().await.unwrap().to_bytes();
        assert!(gzip.len() < page().len() / 10);
        let plain = Inflated::gunzip(Full::new(gzip)).collect().await.unwrap();
        assert_eq!(plain.to_bytes(), page());
        let brotli = Compressed::new(Full::new(page()), Coding::Brotli, 5);
        let brotli = brotli.collect().await.unwrap().to_bytes();
        let mut plain = Vec::new();
        brotli::Decompressor::new(&brotli[..], 4096)
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, page());
    }

    #[tokio::test]
    async fn what_the_node_has_sent_goes_out_before_the_node_sends_more() {
        let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
        let stream = tokio_stream_of(receiver);
        let mut body = Compressed::new(StreamBody::new(stream), Coding::Gzip, 5);
        sender
            .send(Ok(Frame::data(Bytes::from("data: first\n\n"))))
            .await
            .unwrap();
        // The node says nothing more: what it said so far must still arrive (after
        // the gzip header, which goes first).
        let mut zipped = Vec::new();
        let mut plain = String::new();
        while plain.is_empty() {
            let frame = body.frame().await.unwrap().unwrap();
            zipped.extend_from_slice(&frame.into_data().unwrap());
            let _ = flate2::read::GzDecoder::new(&zipped[..]).read_to_string(&mut plain);
        }
        assert_eq!(plain, "data: first\n\n");
        drop(sender);
        assert!(body.collect().await.is_ok());
    }

    /// A receiver as a stream of frames.
    fn tokio_stream_of(
        mut receiver: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    ) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, BoxError>> + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| {
            receiver.poll_recv(cx)
        }))
    }
}

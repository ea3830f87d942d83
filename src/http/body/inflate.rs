//! A gzip body turned back into plain bytes as it streams, for a client that does
//! not take gzip: how the asset cache answers such a client from the one gzip copy
//! it keeps (what Varnish does), and how a node's gzip answer to a request the cache
//! asked in gzip reaches that client.
//!
//! Why in pieces: a gzip body can be a thousand times larger plain. The input is
//! fed [`PIECE`] bytes at a time and each piece's output is sent before the next is
//! read, so memory stays at one piece's output whatever the body's size (for text,
//! a few times the piece; at worst deflate's 1032:1, some 8 MiB).

use std::io::Write;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::buf::Writer;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::write::GzDecoder;
use http::header::{self, HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};

use super::splice::{PassThrough, Splice};
use super::BoxError;

/// The most gzip input decoded before its output is sent on.
const PIECE: usize = 8 * 1024;

/// A body passed on as it is, or gunzipped on its way.
#[derive(Debug)]
pub struct Inflated<B> {
    inner: B,
    /// `None`: passed on as it is (no allocation for the answers that need none).
    inflating: Option<Box<Inflating>>,
}

#[derive(Debug)]
struct Inflating {
    decoder: GzDecoder<Writer<BytesMut>>,
    /// Input read from the inner body and not yet decoded.
    rest: Bytes,
    /// The inner body has ended (its last output may still be owed).
    ended: bool,
    done: bool,
}

impl<B> Inflated<B> {
    /// `inner`, passed on as it is.
    pub fn plain(inner: B) -> Self {
        Self {
            inner,
            inflating: None,
        }
    }

    /// `inner`, a gzip body, gunzipped.
    pub fn gunzip(inner: B) -> Self {
        let inflating = Inflating {
            decoder: GzDecoder::new(BytesMut::new().writer()),
            rest: Bytes::new(),
            ended: false,
            done: false,
        };
        Self {
            inner,
            inflating: Some(Box::new(inflating)),
        }
    }
}

/// The headers of a gzip answer as the gunzipped answer goes out: no
/// `Content-Encoding`, no length (it is not known before the end), and the `ETag`
/// weak, since the bytes are not the node's (as nginx's `gunzip` does).
pub fn gunzipped_headers(headers: &mut HeaderMap) {
    headers.remove(header::CONTENT_ENCODING);
    headers.remove(header::CONTENT_LENGTH);
    weaken_etag(headers);
}

/// Makes a strong `ETag` weak: the bytes a changed coding sends are equivalent to
/// the origin's, never the same (RFC 9110 8.8.1), so a range or a strong compare
/// must not match them.
pub fn weaken_etag(headers: &mut HeaderMap) {
    let Some(etag) = headers.get_mut(header::ETAG) else {
        return;
    };
    if etag.as_bytes().starts_with(b"W/") {
        return;
    }
    let mut weak = Vec::with_capacity(etag.len() + 2);
    weak.extend_from_slice(b"W/");
    weak.extend_from_slice(etag.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&weak) {
        *etag = value;
    }
}

/// Whether an answer's `Content-Encoding` is exactly gzip.
pub fn is_gzip(headers: &HeaderMap) -> bool {
    let mut codings = headers.get_all(header::CONTENT_ENCODING).iter();
    let gzip = |value: &HeaderValue| {
        let value = value.as_bytes().trim_ascii();
        value.eq_ignore_ascii_case(b"gzip") || value.eq_ignore_ascii_case(b"x-gzip")
    };
    codings.next().is_some_and(gzip) && codings.next().is_none()
}

impl Inflating {
    /// Decodes the next piece of the input; its output, possibly empty.
    fn piece(&mut self) -> Result<Bytes, BoxError> {
        let take = self.rest.len().min(PIECE);
        let input = self.rest.split_to(take);
        let mut input = &input[..];
        while !input.is_empty() {
            let used = self.decoder.write(input)?;
            if used == 0 {
                // The gzip stream has ended: what follows it is not part of the file.
                return Err("bytes after the end of a gzip body".into());
            }
            input = &input[used..];
        }
        Ok(self.decoder.get_mut().get_mut().split().freeze())
    }

    /// The input has ended: the last output, the stream checked whole.
    fn finish(&mut self) -> Result<Bytes, BoxError> {
        self.decoder.try_finish()?;
        self.done = true;
        Ok(self.decoder.get_mut().get_mut().split().freeze())
    }
}

impl<B> Body for Inflated<B>
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
        let Some(inflating) = this.inflating.as_mut() else {
            return Pin::new(&mut this.inner).poll_frame(cx).map_err(Into::into);
        };
        loop {
            if inflating.done {
                return Poll::Ready(None);
            }
            let output = if inflating.rest.has_remaining() {
                inflating.piece()
            } else if inflating.ended {
                inflating.finish()
            } else {
                match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        // Trailers of a gzip body say nothing of the plain one.
                        if let Ok(data) = frame.into_data() {
                            inflating.rest = data;
                        }
                        continue;
                    }
                    Some(Err(error)) => return Poll::Ready(Some(Err(error.into()))),
                    None => {
                        inflating.ended = true;
                        continue;
                    }
                }
            };
            match output {
                Ok(output) if output.is_empty() => continue,
                Ok(output) => return Poll::Ready(Some(Ok(Frame::data(output)))),
                Err(error) => {
                    inflating.done = true;
                    return Poll::Ready(Some(Err(error)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inflating {
            None => self.inner.is_end_stream(),
            Some(inflating) => inflating.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inflating {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

impl<B: Splice + Unpin> PassThrough for Inflated<B> {
    type Inner = B;

    fn inner(&self) -> &B {
        &self.inner
    }

    fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Only as it is: gunzipping needs the bytes.
    fn passing(&self) -> bool {
        self.inflating.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use http_body_util::{BodyExt, Full};

    fn gzip(plain: &[u8]) -> Bytes {
        let mut encoder = GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(plain).unwrap();
        Bytes::from(encoder.finish().unwrap())
    }

    #[tokio::test]
    async fn a_gzip_body_arrives_plain_in_pieces_no_larger_than_a_pieces_output() {
        // Text that compresses about as a page does, not a thousandfold.
        let mut seed = 7u32;
        let plain: Vec<u8> = (0..3_000_000)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                b"abcdefgh <>/\n"[(seed >> 16) as usize % 13]
            })
            .collect();
        let mut body = Inflated::gunzip(Full::new(gzip(&plain)));
        let mut got = Vec::new();
        let mut frames = 0;
        while let Some(frame) = body.frame().await {
            got.extend_from_slice(&frame.unwrap().into_data().unwrap());
            frames += 1;
        }
        assert_eq!(got, plain);
        assert!(frames > 10, "streamed in pieces, not at once ({frames})");
    }

    #[tokio::test]
    async fn a_cut_gzip_body_is_an_error_not_a_short_file() {
        let whole = gzip(b"body { color: red }");
        let cut = whole.slice(..whole.len() - 4);
        let collected = Inflated::gunzip(Full::new(cut)).collect().await;
        assert!(collected.is_err());
    }

    #[test]
    fn a_strong_etag_is_made_weak_and_a_weak_one_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(header::ETAG, HeaderValue::from_static("\"abc\""));
        weaken_etag(&mut headers);
        assert_eq!(headers[header::ETAG], "W/\"abc\"");
        weaken_etag(&mut headers);
        assert_eq!(headers[header::ETAG], "W/\"abc\"");
    }
}

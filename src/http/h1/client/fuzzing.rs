//! An entry point into the node answer reader for the fuzz targets (`fuzz/`) and
//! the differential tests (`tests/differential.rs`): a node's bytes read as
//! [`Connection::poll_head`] and [`Connection::poll_data`] read them, without a
//! node to send them (a socket per input would cap a fuzzer at a few thousand
//! inputs a second). Hidden from the docs: not for the gateway's use.

use bytes::BytesMut;
use http::Response;

use super::{ClientError, Connection, Decoder, Reading, NODE_BUFFER};

/// How an answer's body was framed, as the reader decided from its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerFraming {
    /// No body (a `HEAD`'s answer, `204`, `304`, `101`, or a length of 0).
    None,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the node closes the connection.
    Close,
}

/// A node's answer as the reader took it.
#[derive(Debug)]
pub struct Answer {
    /// The head, every line the reader passes on in its map.
    pub response: Response<()>,
    /// How its body was framed.
    pub framing: AnswerFraming,
    /// The body, decoded.
    pub body: Vec<u8>,
    /// The connection would go back to the pool: the answer was read whole, the
    /// node did not ask to close, and no byte came after it.
    pub kept: bool,
}

impl Connection {
    /// Reads `bytes` as the node's answer to the request last started (a `HEAD`
    /// when `head_request`), the bytes arriving `piece` at a time (at least one)
    /// and the node closing after the last. The connection's own socket is not
    /// touched.
    pub fn read_answer(
        &mut self,
        bytes: &[u8],
        head_request: bool,
        piece: usize,
    ) -> Result<Answer, ClientError> {
        self.buf = BytesMut::new();
        self.reading = Reading::Head;
        self.head_request = head_request;
        self.keep_alive = true;
        self.request_head = None;
        let mut rest = bytes;
        let mut arrive = |buf: &mut BytesMut| {
            let (now, later) = rest.split_at(piece.max(1).min(rest.len()));
            buf.extend_from_slice(now);
            rest = later;
            !now.is_empty()
        };
        // As `poll_head`, the request all sent.
        let response = loop {
            if !self.buf.is_empty() {
                if let Some(response) = self.parse_head()? {
                    break response;
                }
                if self.buf.len() >= NODE_BUFFER {
                    return Err(ClientError::HeadTooLarge);
                }
            }
            if !arrive(&mut self.buf) {
                self.keep_alive = false;
                return Err(ClientError::ClosedBeforeAnswer);
            }
        };
        let framing = match self.reading {
            Reading::Body(Decoder::Length(len)) => AnswerFraming::Length(len),
            Reading::Body(Decoder::Chunked(_)) => AnswerFraming::Chunked,
            Reading::Body(Decoder::Close) => AnswerFraming::Close,
            _ => AnswerFraming::None,
        };
        // As `poll_data`.
        let mut body = Vec::new();
        while let Reading::Body(decoder) = self.reading {
            match self.decode(decoder)? {
                Some(data) => body.extend_from_slice(&data),
                None if self.reading == Reading::Done => {}
                None if arrive(&mut self.buf) => {}
                None if decoder == Decoder::Close => self.reading = Reading::Done,
                None => return Err(ClientError::ClosedMidBody),
            }
        }
        // What came after the answer is in the buffer when the pool looks.
        self.buf.extend_from_slice(rest);
        let kept = self.finish();
        Ok(Answer {
            response,
            framing,
            body,
            kept,
        })
    }
}

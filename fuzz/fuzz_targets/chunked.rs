//! The node answer reader's chunk decoder against a strict RFC 9112 7.1 decoder:
//! the input is a chunked body after `HTTP/1.1 200 OK` and
//! `Transfer-Encoding: chunked`. The first byte chooses the piece size the bytes
//! arrive in.
#![no_main]

#[path = "../../tests/http_reference/mod.rs"]
mod http_reference;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let piece = usize::from(first) + 1;
    if let Err(difference) = http_reference::check_chunked(body, piece) {
        panic!("{:?}\n{difference}", String::from_utf8_lossy(body));
    }
});

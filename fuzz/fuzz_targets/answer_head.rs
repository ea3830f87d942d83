//! The node answer reader (head, framing, body, whether the connection is kept)
//! against a plain RFC 9112 reading over `httparse`, on the same bytes, and
//! against itself with the bytes arriving in pieces. The first byte chooses the
//! piece size and whether the request was a `HEAD`.
#![no_main]

#[path = "../../tests/http_reference/mod.rs"]
mod http_reference;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, bytes)) = data.split_first() else {
        return;
    };
    let head_request = first & 0x80 != 0;
    let piece = usize::from(first & 0x7f) + 1;
    if let Err(difference) = http_reference::check_answer(bytes, head_request, piece) {
        panic!("{:?}\n{difference}", String::from_utf8_lossy(bytes));
    }
});

//! The students' request head parser against a plain RFC 9112 reading over
//! `httparse` and against hyper's server, on the same bytes (see
//! `tests/http_reference/mod.rs` for the rules and the deliberate differences).
#![no_main]

#[path = "../../tests/http_reference/mod.rs"]
mod http_reference;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(difference) = http_reference::check_request(data, true) {
        panic!("{:?}\n{difference}", String::from_utf8_lossy(data));
    }
});

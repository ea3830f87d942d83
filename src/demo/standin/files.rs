//! The stand-in site's file pool: the course's files as Moodle stores them, by
//! content hash under `filedir/`, and the two ways they leave it. The data server
//! sends a SCORM file itself (a shared session store); with the offload a node
//! checks the login and names the file (`X-Accel-Redirect`, Moodle's
//! `readfile_accel()`), and the data server's file export sends the bytes.
//!
//! The bytes are the same either way, so a test or a student can tell that a file
//! came from the data server whichever path it took.

use std::hash::Hasher;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_TYPE, ETAG};
use http::{Response, StatusCode};
use http_body_util::Full;
use siphasher::sip128::{Hasher128, SipHasher13};

use super::reply;

/// Size of `.../big.bin`: enough to cross many body chunks.
pub const BIG_FILE: usize = 1 << 20;

/// `$CFG->xsendfilealiases`' key on the stand-in nodes, and the export's prefix.
pub const ALIAS: &str = "/dataroot/";

/// The SCORM package's launch page, below the site: what the player links.
pub const SCORM_LAUNCH: &str = "/pluginfile.php/27/mod_scorm/content/1/index.html";

/// The course's files (below the site, as `pluginfile.php` names them) and their
/// types: the SCORM package's launch page and a large asset, and a handout (a file
/// resource, which `doctor --login` finds through the course page).
const POOL: [(&str, &str); 3] = [
    (SCORM_LAUNCH, "text/html; charset=utf-8"),
    (
        "/pluginfile.php/27/mod_scorm/content/1/big.bin",
        "application/octet-stream",
    ),
    (
        "/pluginfile.php/31/mod_resource/content/1/handout.txt",
        "text/plain; charset=utf-8",
    ),
];

/// What the data server holds for a file at `path` (the whole URL path).
pub(super) fn stored(path: &str) -> Bytes {
    if path.ends_with("/big.bin") {
        return (0..BIG_FILE).map(|i| (i % 251) as u8).collect();
    }
    Bytes::from(format!("SCORM {path} from data\n"))
}

/// A file's place in the pool: `xx/yy/<hash>` as Moodle's `filedir` lays it out
/// (Moodle hashes the content with SHA-1; the stand-in hashes the name).
fn contenthash(rest: &str) -> String {
    let mut hasher = SipHasher13::new();
    hasher.write(rest.as_bytes());
    let hex = format!("{:032x}", hasher.finish128().as_u128());
    format!("{}/{}/{hex}", &hex[..2], &hex[2..4])
}

/// A logged-in student's `pluginfile.php` on a node with `$CFG->xsendfile`: the
/// file's headers and its place under [`ALIAS`], no bytes; 404 for a file the pool
/// lacks (Moodle's `send_file_not_found()`).
pub(super) fn accelerated(rest: &str) -> Response<Full<Bytes>> {
    let Some((name, content_type)) = POOL.iter().find(|(name, _)| *name == rest) else {
        return reply(StatusCode::NOT_FOUND, "file not found\n");
    };
    let hash = contenthash(name);
    let filename = name.rsplit('/').next().unwrap_or("file");
    let mut response = Response::new(Full::new(Bytes::new()));
    let headers = response.headers_mut();
    let value = |text: String| HeaderValue::try_from(text).expect("pool names are header-safe");
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    let disposition = format!("inline; filename=\"{filename}\"");
    headers.insert(CONTENT_DISPOSITION, value(disposition));
    let private = HeaderValue::from_static("private, max-age=10, no-transform");
    headers.insert(CACHE_CONTROL, private);
    headers.insert(ETAG, value(format!("\"{}\"", &hash[6..])));
    let place = format!("{ALIAS}filedir/{hash}");
    headers.insert("x-accel-redirect", value(place));
    response
}

/// The data server's file export: a plain web server for the pool under
/// [`ALIAS`]`filedir/`, every file `application/octet-stream`; 404 for the rest
/// (the prefix itself too, as an nginx without `autoindex` answers).
pub(super) fn exported(path: &str, site: &str) -> Response<Full<Bytes>> {
    let wanted = path
        .strip_prefix(ALIAS)
        .and_then(|p| p.strip_prefix("filedir/"));
    let file = wanted.and_then(|hash| POOL.iter().find(|(name, _)| contenthash(name) == hash));
    let Some((name, _)) = file else {
        return reply(StatusCode::NOT_FOUND, "404 Not Found\n");
    };
    let mut response = Response::new(Full::new(stored(&format!("{site}{name}"))));
    let octets = HeaderValue::from_static("application/octet-stream");
    response.headers_mut().insert(CONTENT_TYPE, octets);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_file_is_the_export_s_and_an_unknown_one_is_not_found() {
        let named = accelerated(SCORM_LAUNCH);
        let place = named.headers()["x-accel-redirect"].to_str().unwrap();
        assert!(place.starts_with("/dataroot/filedir/"), "{place}");
        let bytes = exported(place, "/moodle");
        assert_eq!(bytes.status(), StatusCode::OK);
        let missing = accelerated("/pluginfile.php/27/mod_scorm/content/1/gone.html");
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        assert_eq!(exported("/dataroot/", "").status(), StatusCode::NOT_FOUND);
    }
}

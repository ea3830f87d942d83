//! A request for one of Moodle's revisioned assets meets the asset cache: answered
//! from memory, or it fills the entry, or it waits for the request filling it.
//!
//! Why before the session lookup: these scripts never read a session, so a hit
//! touches no session, takes no node slot and counts in no deal. A miss goes on as
//! any request does, and fills the entry on its way back when Moodle's answer says
//! it may be kept.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::HOST;
use http::{Method, Request, Response};
use http_body_util::{Either, Full};

use super::Gateway;
use crate::http::body::inflate::Inflated;
use crate::http::upstream::asset_cache::{Fill, Lookup, Role, Wants, FILL_WAIT};

/// What the cache says of one request.
pub(super) enum Cached {
    /// The answer, from memory (gunzipped for a browser that takes no gzip).
    Hit(Response<Either<Full<Bytes>, Inflated<Full<Bytes>>>>),
    /// Ask the node, and keep its answer.
    Fill(Fill),
    /// Ask the node (not an asset the cache keeps, or a fill that kept nothing).
    Node,
}

impl Gateway {
    /// The cache's word on `request`, a sessionless one.
    pub(super) async fn cached<B>(&self, request: &Request<B>) -> Cached {
        let method = request.method();
        let (uri, headers) = (request.uri(), request.headers());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let asset = self.site.is_revisioned_asset(uri.path(), uri.query(), now);
        if !asset || (method != Method::GET && method != Method::HEAD) {
            return Cached::Node;
        }
        // An HTTP/2 request names its host in the URI; the edge made sure one exists.
        let host = (uri.authority().map(|a| a.as_str().as_bytes()))
            .or_else(|| headers.get(HOST).map(|h| h.as_bytes()))
            .unwrap_or_default();
        let target = uri.path_and_query().map_or("/", |p| p.as_str());
        // One allocation: the host lowercased (it is case-insensitive), then the target.
        let mut key = String::with_capacity(host.len() + target.len());
        key.extend(
            String::from_utf8_lossy(host)
                .chars()
                .map(|c| c.to_ascii_lowercase()),
        );
        key.push_str(target);
        let wants = Wants::from_headers(headers);
        let role = if *method == Method::HEAD {
            Role::Head
        } else {
            Role::First
        };
        let mut looked = self.cache.lookup(&key, &wants, role);
        if let Lookup::Wait(mut filling) = looked {
            // One node request per URL at a time; the others read what it kept.
            let _ = tokio::time::timeout(FILL_WAIT, filling.wait_for(|&done| done)).await;
            looked = self.cache.lookup(&key, &wants, Role::Waited);
        }
        match looked {
            Lookup::Hit(entry) => Cached::Hit(entry.answer_for(method, headers, &wants)),
            Lookup::Fill(fill) => Cached::Fill(fill),
            Lookup::Wait(_) | Lookup::Pass => Cached::Node,
        }
    }

    /// The asset cache, for the admin API and `/metrics`.
    pub fn asset_cache(&self) -> &crate::http::upstream::asset_cache::AssetCache {
        &self.cache
    }
}

//! What the tower-http layers around the admin API (composed in [`super::router`])
//! need from us: the span each request is traced in, and how long a request may take.
//!
//! Why a span of our own rather than tower-http's default: the default records the
//! whole URI, and `GET /affinity/lookup?session=RAW_ID` carries a raw session id,
//! a bearer credential that must never reach a log. The path is enough to tell the
//! requests apart; the headers are recorded after `Authorization` and `Cookie` were
//! marked sensitive, so the token shows as `Sensitive`.

use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use tracing::Span;

/// The longest an admin request may take before it is answered 503. Every route
/// answers in milliseconds (a page over a million sessions, a reload with its TLS
/// files); 30 s only cuts what is stuck.
pub(super) const TIMEOUT: Duration = Duration::from_secs(30);

/// The debug span of one admin request: method, path (never the query) and the
/// headers as the sensitive-headers layer left them.
pub(super) fn span(request: &Request<Body>) -> Span {
    tracing::debug_span!(
        "admin",
        method = %request.method(),
        path = %request.uri().path(),
        headers = ?request.headers(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use axum::extract::ConnectInfo;
    use axum::http::StatusCode;
    use tower::ServiceExt;

    use crate::admin::{router, Reload};
    use crate::config::Config;
    use crate::gateway::Gateway;
    use crate::sessions::clock::Clock;

    const TOKEN: &str = "layers-admin-token-0123456789abcdef";

    fn admin(reload: Reload) -> axum::Router {
        let config = format!(
            "[admin]\ntoken = \"{TOKEN}\"\n[[nodes]]\nname = \"web1\"\n\
             url = \"http://10.0.0.1\"\n[data]\nname = \"data\"\nurl = \"http://10.0.0.9\"\n"
        );
        let config = Config::parse(&config, ".".as_ref(), Default::default()).unwrap();
        let gateway = Arc::new(Gateway::new(&config, Clock::default()));
        router(
            gateway,
            TOKEN.to_owned(),
            reload,
            crate::admin::History::default(),
        )
    }

    async fn call(admin: axum::Router, method: &str, uri: &str) -> StatusCode {
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header("x-test", MARK)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("cookie", "MoodleSession=cookie-secret-value")
            .body(Body::empty())
            .unwrap();
        let peer = std::net::SocketAddr::from(([127, 0, 0, 1], 4000));
        request.extensions_mut().insert(ConnectInfo(peer));
        admin.oneshot(request).await.unwrap().status()
    }

    /// Marks this module's requests in the trace, which other tests' lines share.
    const MARK: &str = "admin-layers-test";

    /// Every log line written in this test process.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The process's one subscriber, installed by the first test that asks. Global,
    /// not a thread's default: tracing caches whether a callsite is wanted for every
    /// thread at once, so another test's thread that met a callsite with no
    /// subscriber around could leave it "never" for this one (an empty trace, seen
    /// in about a third of runs beside the admin's other tests).
    fn captured() -> &'static Captured {
        static LOG: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
        LOG.get_or_init(|| {
            let log = Captured::default();
            let writer = log.clone();
            let subscriber = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::DEBUG)
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other test of the library installs a subscriber");
            log
        })
    }

    #[tokio::test]
    async fn the_trace_names_each_request_but_never_its_token_cookie_or_session_id() {
        let log = captured();
        let reload: Reload = Arc::new(|| Err(vec!["no file".into()]));
        let uri = "/affinity/lookup?session=raw-session-id-secret";
        assert_eq!(call(admin(reload), "GET", uri).await, StatusCode::NOT_FOUND);
        let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
        let ours: Vec<&str> = log.lines().filter(|line| line.contains(MARK)).collect();
        assert!(
            ours.iter()
                .any(|line| line.contains("path=/affinity/lookup")),
            "{log}"
        );
        assert!(ours.iter().any(|line| line.contains("status=404")), "{log}");
        assert!(log.contains("\"authorization\": Sensitive"), "{log}");
        for secret in [TOKEN, "cookie-secret-value", "raw-session-id-secret"] {
            assert!(!log.contains(secret), "{secret} in {log}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stuck_admin_request_is_answered_503_after_the_timeout() {
        let (unstick, stuck) = std::sync::mpsc::channel::<()>();
        let stuck = Mutex::new(stuck);
        // The reload blocks until the test ends (the sender is dropped then).
        let reload: Reload = Arc::new(move || {
            let _ = stuck.lock().unwrap().recv();
            Ok(Vec::new())
        });
        let answer = tokio::spawn(call(admin(reload), "POST", "/reload"));
        // A running spawn_blocking keeps the paused clock from moving by itself.
        let mut waited = Duration::ZERO;
        while !answer.is_finished() && waited < 2 * TIMEOUT {
            tokio::task::yield_now().await;
            tokio::time::advance(Duration::from_secs(1)).await;
            waited += Duration::from_secs(1);
        }
        assert_eq!(answer.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(waited >= TIMEOUT, "answered after {waited:?}");
        drop(unstick);
    }
}

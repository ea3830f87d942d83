//! The students' path: what every request on the public listener passes through,
//! in order, read top to bottom in [`students`].
//!
//! What is a layer: each step that looks at a request before the gateway decides
//! where it goes and may answer it itself (the access log, the edge rules, the
//! in-flight cap, the withheld login cookie). What is not: classifying the request,
//! looking its session up, routing it, its node's slot, forwarding, learning from
//! the node's `Set-Cookie` and the per-node counters all need the route chosen
//! in the middle of them, so they stay one journey ([`Gateway::journey`]); as layers
//! they would hand the route down and back through the request's extensions, an
//! allocation each.
//!
//! Why not tower's own middleware: `ConcurrencyLimit` queues a request past its
//! limit where a student must get a quick 503, and its size is fixed when built
//! while `max_in_flight` changes on reload (and is shown on the dashboard);
//! tower-http's `RequestBodyLimit` is one of the edge's several rules, and its
//! `Trace` emits tracing events, not the combined log format's line. No layer boxes
//! its future or the body, and the journey's future is boxed once, where it is
//! made: the stack costs a few reference counts and small moves per request.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::cluster::slots::Class;
use crate::http::h1::server::StudentBody;
use futures_util::future::Either;
use http::header::STRICT_TRANSPORT_SECURITY;
use http::{Request, Response};
use tower::{Layer, Service, ServiceBuilder};
use tower_http::set_header::SetResponseHeaderLayer;

use super::limiter::RateLimitLayer;
use super::{Gateway, ProxyBody, Served, Settings, SettingsCache};
use crate::access_log::{AccessLog, AccessLogLayer, Logged, Trail};
use crate::error::GatewayError;
use crate::http::body::compress::Compressed;
use crate::http::upstream::proxy::{Client, Withheld};
use compress::CompressLayer;

/// The students' path for one connection from `client`: every layer a request passes
/// through, outermost first, and the gateway's journey at the bottom. `withheld` is
/// the cookie of the admin listener's login, which no node may see.
pub fn students(
    gateway: Arc<Gateway>,
    log: AccessLog,
    withheld: Arc<Withheld>,
    client: Client,
) -> impl Service<
    Request<StudentBody>,
    Response = Response<Logged<Compressed<ProxyBody>>>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static {
    // Taken when the connection opens: a reload applies to the next ones.
    let hsts = match client.tls {
        true => gateway.settings_cache().load().hsts.clone(),
        false => None,
    };
    let client = Arc::new(client);
    // Only a log that writes lines asks the journey for its trail.
    let noting = log.is_on();
    let journey = {
        let (gateway, client) = (gateway.clone(), client.clone());
        let mut settings = gateway.settings_cache();
        move |request| {
            let settings = settings.load().clone();
            // Boxed here, at the bottom: each layer above wraps the future it is
            // given by value, so the journey's 4 KB would be copied once per layer;
            // boxed, the layers move a pointer, and one allocation replaces them.
            Box::pin(journey(
                gateway.clone(),
                client.clone(),
                noting,
                settings,
                request,
            ))
        }
    };
    ServiceBuilder::new()
        // Outermost, so every request gets its line, the refusals below included,
        // and one dropped before its answer is logged as 499.
        .layer(AccessLogLayer::new(log, client.ip))
        // Over TLS with `hsts_max_age` set, every answer tells the browser to come
        // back over https only, the gateway's own answers too; a header the node
        // sent itself is left as it is.
        .option_layer(
            hsts.map(|hsts| {
                SetResponseHeaderLayer::if_not_present(STRICT_TRANSPORT_SECURITY, hsts)
            }),
        )
        // Text the node left uncompressed goes out in gzip or brotli; inside the log,
        // which counts the bytes sent, and outside the edge, so its pages are too.
        .layer(CompressLayer::new(gateway.clone()))
        // What a request must be before anything looks at it (method, sizes, one
        // framing, one known host): junk costs no lookup and takes no place.
        .layer(EdgeLayer::new(gateway.clone(), client.clone()))
        // Logins and anonymous page views past `[rate_limits]` get a quick 429,
        // taking no place in flight; a logged-in student is never limited.
        .layer(RateLimitLayer::new(gateway.clone(), client.clone()))
        // Never an unbounded queue: past `max_in_flight` a student gets a quick 503.
        .layer(InFlightLayer::new(gateway, client))
        // The dashboard's login is a credential for the admin listener, never for a
        // node: gone before the journey can forward it.
        .layer(WithholdLayer(withheld))
        .service_fn(journey)
}

/// The gateway's part: classify, route, forward, learn, on the settings in force
/// when the request came; with the log on, what it learnt of the request goes back
/// in the response's extensions for the line.
///
/// Not an `async fn`, which would keep the request twice (as it came and as a
/// local) in the future every request boxes; the block moves it once.
#[allow(clippy::manual_async_fn)]
fn journey(
    gateway: Arc<Gateway>,
    client: Arc<Client>,
    noting: bool,
    settings: Arc<Settings>,
    request: Request<StudentBody>,
) -> impl Future<Output = Result<Response<ProxyBody>, Infallible>> {
    async move {
        let mut served = Served::default();
        let journey = gateway.journey(request, &client, &mut served, &settings);
        let mut response = journey.await;
        if noting {
            response.extensions_mut().insert(trail(&settings, served));
        }
        Ok(response)
    }
}

/// The gateway's part of an access log line, by name.
///
/// The node names come from the request's own settings: the node it went to is in
/// them, and no second load of the swap is needed.
fn trail(settings: &Settings, served: Served) -> Trail {
    let upstreams = &settings.upstreams;
    let name = |id| {
        let data = upstreams.data();
        let upstream = upstreams.get(id).or((data.id == id).then_some(data));
        upstream.map(|u| u.name.clone())
    };
    Trail {
        upstream: served.upstream.and_then(name),
        upstream_time: served.upstream_time,
        queue_time: served.waited,
        class: served.waited.and(served.class).map(Class::as_str),
        cached: served.cached,
        session: served.session.map(|key| key.to_string()),
    }
}

/// A refusal answered at once, or the inner service's answer.
type Refusable<F, E> = Either<Ready<Result<Response<ProxyBody>, E>>, F>;

/// Applies the edge rules of the settings in force ([`crate::http::accept::edge`]).
#[derive(Debug, Clone)]
pub struct EdgeLayer {
    gateway: Arc<Gateway>,
    client: Arc<Client>,
}

impl EdgeLayer {
    /// The rules for requests from `client`, refused through `gateway` (counted,
    /// logged at most every few seconds).
    pub fn new(gateway: Arc<Gateway>, client: Arc<Client>) -> Self {
        Self { gateway, client }
    }
}

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        let (gateway, client) = (self.gateway.clone(), self.client.clone());
        Edge {
            inner,
            settings: gateway.settings_cache(),
            gateway,
            client,
        }
    }
}

/// The service [`EdgeLayer`] wraps around `S`.
#[derive(Debug, Clone)]
pub struct Edge<S> {
    inner: S,
    settings: SettingsCache,
    gateway: Arc<Gateway>,
    client: Arc<Client>,
}

impl<S, B> Service<Request<B>> for Edge<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>>,
{
    type Response = Response<ProxyBody>;
    type Error = S::Error;
    type Future = Refusable<S::Future, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let admitted = self.settings.load().edge.admit(&mut request);
        match admitted {
            Ok(()) => Either::Right(self.inner.call(request)),
            Err(refused) => {
                let answer = self.gateway.refused(refused, &request, &self.client);
                Either::Left(ready(Ok(answer)))
            }
        }
    }
}

/// Holds each request under `limits.max_in_flight` (of the config in force) from
/// its admission to its response head.
#[derive(Debug, Clone)]
pub struct InFlightLayer {
    gateway: Arc<Gateway>,
    client: Arc<Client>,
}

impl InFlightLayer {
    /// The cap for requests from `client`, counted in `gateway` (its
    /// [`in_flight`](Gateway::in_flight) is the dashboard's figure).
    pub fn new(gateway: Arc<Gateway>, client: Arc<Client>) -> Self {
        Self { gateway, client }
    }
}

impl<S> Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> InFlight<S> {
        let (gateway, client) = (self.gateway.clone(), self.client.clone());
        InFlight {
            inner,
            gateway,
            client,
        }
    }
}

/// The service [`InFlightLayer`] wraps around `S`.
#[derive(Debug, Clone)]
pub struct InFlight<S> {
    inner: S,
    gateway: Arc<Gateway>,
    client: Arc<Client>,
}

impl<S, B> Service<Request<B>> for InFlight<S>
where
    S: Service<Request<B>, Response = Response<ProxyBody>>,
{
    type Response = Response<ProxyBody>;
    type Error = S::Error;
    type Future = Refusable<Holding<S::Future>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let max = self.gateway.max_in_flight.load(Ordering::Relaxed);
        match Place::take(&self.gateway, max) {
            Some(place) => Either::Right(Holding {
                inner: self.inner.call(request),
                place: Some(place),
            }),
            None => {
                let overloaded = GatewayError::Overloaded;
                let answer = self.gateway.refused(overloaded, &request, &self.client);
                Either::Left(ready(Ok(answer)))
            }
        }
    }
}

/// One request's place under `max_in_flight`, given back when dropped.
#[derive(Debug)]
pub struct Place(Arc<Gateway>);

impl Place {
    fn take(gateway: &Arc<Gateway>, max: usize) -> Option<Self> {
        if gateway.in_flight.fetch_add(1, Ordering::Relaxed) >= max {
            gateway.in_flight.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(Self(gateway.clone()))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// The inner service's answer, holding the request's place until its response
    /// head (or until the request is dropped).
    pub struct Holding<F> {
        #[pin]
        inner: F,
        place: Option<Place>,
    }
}

impl<F: Future> Future for Holding<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.inner.poll(cx));
        this.place.take();
        Poll::Ready(answer)
    }
}

/// Takes a cookie of the gateway's own out of every request.
#[derive(Debug, Clone)]
pub struct WithholdLayer(pub Arc<Withheld>);

impl<S> Layer<S> for WithholdLayer {
    type Service = Withhold<S>;

    fn layer(&self, inner: S) -> Withhold<S> {
        Withhold {
            inner,
            withheld: self.0.clone(),
        }
    }
}

/// The service [`WithholdLayer`] wraps around `S`.
#[derive(Debug, Clone)]
pub struct Withhold<S> {
    inner: S,
    withheld: Arc<Withheld>,
}

impl<S, B> Service<Request<B>> for Withhold<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> S::Future {
        self.withheld.strip(request.headers_mut());
        self.inner.call(request)
    }
}

mod compress;
#[cfg(test)]
mod outer_layer;
#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use bytes::Bytes;
    use http::StatusCode;
    use http_body_util::Full;
    use tower::ServiceExt;

    use super::*;
    use crate::config::Config;
    use crate::http::accept::listener::{task_bytes, Listening};
    use crate::sessions::clock::Clock;

    /// A config that admits `max_in_flight` requests at a time; nothing here reaches
    /// a node.
    fn config(max_in_flight: usize) -> Config {
        let text = format!(
            "limits.max_in_flight = {max_in_flight}\n\
             [[nodes]]\nname = \"web1\"\nurl = \"http://127.0.0.1:1\"\n\
             [data]\nname = \"data\"\nurl = \"http://127.0.0.1:3\"\n"
        );
        Config::parse(&text, std::path::Path::new("."), Default::default()).unwrap()
    }

    /// A gateway that admits one request at a time.
    fn gateway() -> Arc<Gateway> {
        Arc::new(Gateway::new(&config(1), Clock::default()))
    }

    /// A service below the cap whose first request is answered only when the
    /// returned sender is used (or dropped); every later one at once.
    fn first_held() -> (
        tokio::sync::oneshot::Sender<()>,
        impl Service<Request<()>, Response = Response<ProxyBody>, Error = Infallible, Future: Send>
            + Clone
            + Send
            + 'static,
    ) {
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let released = Arc::new(std::sync::Mutex::new(Some(released)));
        let below = tower::service_fn(move |_request: Request<()>| {
            let wait = released.lock().unwrap().take();
            async move {
                if let Some(wait) = wait {
                    let _ = wait.await;
                }
                Ok::<_, Infallible>(answer())
            }
        });
        (release, below)
    }

    fn client() -> Arc<Client> {
        Arc::new(Client::new("192.0.2.9".parse().unwrap(), false))
    }

    fn request(method: &str) -> Request<()> {
        let request = Request::builder()
            .method(method)
            .uri("/course/view.php?id=2");
        request
            .header("host", "moodle.example.edu")
            .body(())
            .unwrap()
    }

    fn answer() -> Response<ProxyBody> {
        Response::new(http_body_util::Either::Right(Full::new(Bytes::from(
            "node",
        ))))
    }

    #[tokio::test]
    async fn a_request_the_edge_refuses_never_reaches_what_is_below_it() {
        let reached = Arc::new(AtomicUsize::new(0));
        let below = {
            let reached = reached.clone();
            tower::service_fn(move |_request: Request<()>| {
                reached.fetch_add(1, Ordering::Relaxed);
                async { Ok::<_, Infallible>(answer()) }
            })
        };
        let edge = EdgeLayer::new(gateway(), client()).layer(below);
        let refused = edge.clone().oneshot(request("TRACE")).await.unwrap();
        assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(reached.load(Ordering::Relaxed), 0);
        let admitted = edge.oneshot(request("GET")).await.unwrap();
        assert_eq!(admitted.status(), StatusCode::OK);
        assert_eq!(reached.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn past_max_in_flight_a_request_gets_503_at_once_and_an_answered_one_gives_its_place_back(
    ) {
        let gateway = gateway();
        let (release, below) = first_held();
        let capped = InFlightLayer::new(gateway.clone(), client()).layer(below);
        let first = tokio::spawn(capped.clone().oneshot(request("GET")));
        while gateway.in_flight() == 0 {
            tokio::task::yield_now().await;
        }
        let second = capped.clone().oneshot(request("GET")).await.unwrap();
        assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(gateway.in_flight(), 1, "the refusal took no place");
        release.send(()).unwrap();
        let first = first.await.unwrap().unwrap();
        assert_eq!(first.status(), StatusCode::OK);
        assert_eq!(
            gateway.in_flight(),
            0,
            "its place was given back with its head"
        );
        let third = capped.oneshot(request("GET")).await.unwrap();
        assert_eq!(third.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_reload_changes_max_in_flight_for_the_next_request() {
        let gateway = gateway();
        let (_release, below) = first_held();
        let capped = InFlightLayer::new(gateway.clone(), client()).layer(below);
        let _first = tokio::spawn(capped.clone().oneshot(request("GET")));
        while gateway.in_flight() == 0 {
            tokio::task::yield_now().await;
        }
        let refused = capped.clone().oneshot(request("GET")).await.unwrap();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        gateway.apply(&config(2)).unwrap();
        let admitted = capped.oneshot(request("GET")).await.unwrap();
        assert_eq!(
            admitted.status(),
            StatusCode::OK,
            "the reloaded cap has room"
        );
    }

    #[tokio::test]
    async fn the_withheld_cookie_never_reaches_what_is_below_it() {
        let below = tower::service_fn(|request: Request<()>| async move {
            Ok::<_, Infallible>(request.headers()["cookie"].clone())
        });
        let withheld = Arc::new(Withheld::new("gw-admin"));
        let mut request = request("GET");
        let cookie = "MoodleSession=abc; gw-admin=secret".parse().unwrap();
        request.headers_mut().insert("cookie", cookie);
        let seen = WithholdLayer(withheld).layer(below).oneshot(request);
        assert_eq!(seen.await.unwrap(), "MoodleSession=abc");
    }

    /// An idle keep-alive connection holds its task's future, so that future must
    /// stay small whatever a request in flight needs (the exchange is boxed while it
    /// lasts): thousands of students reading a page each hold one. It was 2,272
    /// bytes in a test build before the connection's futures stopped keeping their
    /// arguments twice and the request's parts across the wait; 1,272 after; 776
    /// once the gateway's own HTTP/1.1 side held no request's `Next` across an
    /// await, it and `http1` were plain functions, the stream was boxed before the
    /// task's block and the listener's closing became a `Notify`; 392 once the
    /// connection was served in a box of its own while awake, and parked between
    /// clicks (the students' stack is in that box, not in the task); 272 once a
    /// parked connection kept only its socket, its `keep_alive` timer (not the
    /// deadline's bookkeeping) and no empty read buffer, and an HTTP/2 connection
    /// ran in a task of its own, so that no task keeps room for what a TLS handshake
    /// hands on. Up to 280, tokio's task cell (128-byte aligned) is 384 bytes; up to
    /// 408, 512; at 536 it was 640.
    #[tokio::test]
    async fn an_idle_connection_task_stays_small() {
        let gateway = Arc::new(Gateway::new(&config(10), Clock::default()));
        let config = config(10);
        let listening = Listening::plain(&config.limits, &config.timeouts);
        let withheld = Arc::new(Withheld::new("gw-admin"));
        let stack_for = move |peer: std::net::SocketAddr, tls| {
            let client = Client::new(peer.ip(), tls);
            students(
                gateway.clone(),
                AccessLog::default(),
                withheld.clone(),
                client,
            )
        };

        let bytes = task_bytes(stack_for, listening).await;
        assert!(bytes <= 280, "a connection's task keeps {bytes} bytes");
    }
}

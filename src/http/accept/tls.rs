//! TLS on the public listener: the certificate (renewed by a `SIGHUP`, no restart),
//! the rustls config that serves it (and resumes returning students by ticket), and
//! the plain-HTTP listener's redirect to HTTPS.
//!
//! The config is built once and never rebuilt: it holds a resolver that reads the
//! current certificate from an [`ArcSwap`] at each handshake. A renewal (Let's
//! Encrypt every 60 to 90 days) is then one pointer swap: new handshakes get the new
//! certificate, and open connections, whose handshake is long done, keep the keys they
//! agreed on. A reload that fails leaves the old certificate in place, so a half-
//! written file during a renewal never takes the site down.
//!
//! rustls runs on `ring` (it builds with the C compiler every machine here has), so
//! every config names its provider instead of relying on a process-wide default.

use std::any::Any;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use dashmap::DashMap;
use http::uri::Authority;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use rustls::crypto::{ring, CryptoProvider};
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache};
use rustls::sign::CertifiedKey;
use rustls::{Error as TlsError, InconsistentKeys, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The certificate and key, reloadable: a SIGHUP reads the files again and new
/// handshakes use the new certificate while open connections keep theirs.
///
/// `ArcSwap<CertifiedKey>` already stores an `Arc<CertifiedKey>`, which is what the
/// resolver hands rustls: a handshake costs one atomic load, never a lock.
pub struct Certificates {
    current: ArcSwap<CertifiedKey>,
    cert_path: PathBuf,
    key_path: PathBuf,
    /// TLS-ALPN-01 (RFC 8737): while a CA checks a name, the certificate that
    /// proves it, served only to a handshake that offers `acme-tls/1`. Empty but
    /// for the seconds of a validation, so a student's handshake pays one look at
    /// its ALPN list and no lookup.
    challenges: DashMap<String, Arc<CertifiedKey>>,
}

impl Certificates {
    /// Reads and checks both files (PEM chain, leaf first; PKCS#8, PKCS#1 or SEC1
    /// key) and that the key matches the leaf certificate, so a wrong pair fails at
    /// start rather than at every student's handshake. The error names the file and
    /// the reason in lowercase.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Certificates>, String> {
        let current = read_pair(cert, key)?;
        Ok(Arc::new(Certificates {
            current: ArcSwap::from_pointee(current),
            cert_path: cert.to_owned(),
            key_path: key.to_owned(),
            challenges: DashMap::new(),
        }))
    }

    /// Reads the files again; on error the current certificate stays in use and the
    /// error is returned (for the caller to log: a renewal may be half-written).
    pub fn reload(&self) -> Result<(), String> {
        let fresh = read_pair(&self.cert_path, &self.key_path)?;
        self.current.store(Arc::new(fresh));
        Ok(())
    }

    /// Answers a TLS-ALPN-01 validation of `name` with `cert` (PEM chain and key)
    /// until [`close_challenge`](Self::close_challenge).
    pub fn open_challenge(&self, name: &str, cert: &str, key: &str) -> Result<(), String> {
        let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("challenge certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
            .map_err(|e| format!("challenge key: {e}"))?;
        let signing_key = provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| format!("challenge key: {e}"))?;
        let pair = Arc::new(CertifiedKey::new(chain, signing_key));
        self.challenges.insert(name.to_ascii_lowercase(), pair);
        Ok(())
    }

    /// The validation of `name` is over: its certificate is no longer served.
    pub fn close_challenge(&self, name: &str) {
        self.challenges.remove(&name.to_ascii_lowercase());
    }

    /// The certificate new handshakes get, as DER, leaf first.
    pub fn current_chain(&self) -> Vec<CertificateDer<'static>> {
        self.current.load().cert.clone()
    }
}

/// Written by hand: only the paths, the key material has no business in a log.
impl fmt::Debug for Certificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificates")
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .finish_non_exhaustive()
    }
}

/// The one crypto provider; built per use because it is a few static tables.
fn provider() -> CryptoProvider {
    ring::default_provider()
}

/// Reads the chain and the key and checks that they belong together.
fn read_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain = read_chain(cert)?;
    let signing_key = provider()
        .key_provider
        .load_private_key(read_key(key)?)
        .map_err(|e| format!("{}: unusable private key: {e}", key.display()))?;
    let pair = CertifiedKey::new(chain, signing_key);
    match pair.keys_match() {
        // `Unknown`: the key cannot name its public half; rustls itself accepts that.
        Ok(()) | Err(TlsError::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(pair),
        Err(TlsError::InconsistentKeys(InconsistentKeys::KeyMismatch)) => Err(format!(
            "{}: the key does not match the first certificate of {}",
            key.display(),
            cert.display()
        )),
        Err(e) => Err(format!(
            "{}: the first certificate cannot be parsed: {e}",
            cert.display()
        )),
    }
}

/// The PEM chain, leaf first; an empty one is an error, not an empty handshake.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if chain.is_empty() {
        return Err(format!(
            "{}: no certificate found (expected a PEM chain, leaf first)",
            path.display()
        ));
    }
    Ok(chain)
}

/// The first private key in the file: PKCS#8, PKCS#1 or SEC1, whatever else is there.
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        pem::Error::NoItemsFound => format!(
            "{}: no unencrypted private key found (expected PEM: PKCS#8, PKCS#1 or SEC1)",
            path.display()
        ),
        other => pem_error(path, other),
    })
}

fn pem_error(path: &Path, error: pem::Error) -> String {
    match error {
        pem::Error::Io(e) => format!("cannot read {}: {}", path.display(), lower_first(&e)),
        other => format!("{}: not valid PEM: {other}", path.display()),
    }
}

/// `std::io::Error` reads "No such file…"; our messages start in lowercase.
fn lower_first(error: &dyn fmt::Display) -> String {
    let text = error.to_string();
    let mut chars = text.chars();
    chars
        .next()
        .map_or(String::new(), |c| c.to_lowercase().chain(chars).collect())
}

/// TLS 1.2 sessions a client without tickets can resume by id, least recently used
/// out: nginx's `ssl_session_cache shared:SSL:10m` holds about as many. rustls's
/// default, 256, resumed none of 1,000 students' reconnects. The cache reserves its
/// table up front (some 4 MB of address space, touched only as sessions come).
const SESSION_CACHE: usize = 40_000;

/// Hands every handshake the current certificate. SNI is not consulted: the
/// gateway serves one site, whose certificate carries all the names it answers to
/// (and a client that sends no SNI, one dialling an IP address, is served too).
#[derive(Debug)]
struct CurrentCertificate(Arc<Certificates>);

impl ResolvesServerCert for CurrentCertificate {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut alpn = hello.alpn().into_iter().flatten();
        if alpn.any(|protocol| protocol == ACME_TLS_ALPN) {
            // A CA validating a name (it offers nothing else): the challenge's
            // certificate or no handshake, never the site's (RFC 8737 section 3).
            let name = hello.server_name()?.to_ascii_lowercase();
            return self.0.challenges.get(&name).map(|c| c.clone());
        }
        Some(self.0.current.load_full())
    }
}

/// The ALPN protocol of a TLS-ALPN-01 validation (RFC 8737).
const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// A rustls server config that always serves the current certificate (a
/// `ResolvesServerCert` reading the ArcSwap), with ALPN ["h2", "http/1.1"] (only
/// "http/1.1" when `http2` is false), TLS 1.2 and 1.3.
///
/// TLS 1.2 stays because school networks still have old Android tablets and
/// inspection boxes that stop there. The server's ALPN order wins, so a client that
/// offers both gets HTTP/2. A client that offers ALPN but none of ours is refused
/// with a `no_application_protocol` alert (RFC 7301) rather than served a protocol it
/// did not ask for; one that offers no ALPN at all gets HTTP/1.1. rustls's TLS 1.2
/// suites are all ECDHE with AEAD, so none is on HTTP/2's forbidden list (RFC 9113).
///
/// A student who comes back (a connection closed after `keep_alive`, a phone that
/// changed networks) resumes instead of a full handshake: an abbreviated handshake
/// costs no signature and a round trip less on TLS 1.2. Resumption is by stateless
/// tickets (TLS 1.3, and TLS 1.2 clients that ask), sealed with a key rustls makes
/// and rotates every 6 hours (a ticket lives 12), so any number of students resume
/// for no memory on the gateway; a TLS 1.2 client without tickets resumes by id from
/// `SESSION_CACHE`. The keys live in this process: after a restart, or on another
/// gateway, the first handshake is a full one, unless the gateways share a store and
/// with it their ticket keys ([`crate::http::accept::tickets`], put in by the app).
pub fn server_config(certs: Arc<Certificates>, http2: bool) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("ring supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(CurrentCertificate(certs)));
    // Only if the system's random source fails, which would fail every handshake
    // too: the gateway then serves full handshakes, as without tickets.
    match ring::Ticketer::new() {
        Ok(ticketer) => config.ticketer = ticketer,
        Err(error) => tracing::warn!("no TLS session tickets: {error}"),
    }
    config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE);
    // Never 0-RTT (rustls's default, said here so that nobody turns it on): early
    // data can be replayed by anyone who recorded it, and a replayed POST is a quiz
    // answer or a forum post sent twice. Resumption keeps its full round trip.
    config.max_early_data_size = 0;
    // The server's order of suites, not the client's: every suite offered is an
    // AEAD with forward secrecy, and the first, AES-GCM, is the one this machine
    // computes in hardware, which keeps a handshake wave's CPU low. A client that
    // offers no AES-GCM still gets ChaCha20.
    config.ignore_client_order = true;
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    // Last, so no browser ever gets it; the resolver refuses a handshake that asks
    // for it unless a challenge for that name is open.
    config.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
    Arc::new(config)
}

/// The acceptor the accept loop wraps each TCP stream with.
pub fn acceptor(config: Arc<ServerConfig>) -> TlsAcceptor {
    TlsAcceptor::from(config)
}

/// Whether the negotiated protocol of an accepted stream is HTTP/2 (ALPN "h2"), so
/// the accept loop knows which hyper connection to serve it with.
pub fn is_http2(stream: &TlsStream<TcpStream>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(b"h2")
}

/// How long a browser may remember the redirect. A 308 is cacheable by default and
/// browsers keep permanent redirects indefinitely when told nothing; remembering it
/// saves a student the plain-HTTP round trip, but a mistake (a wrong `https_port`)
/// would then stick long after it is fixed. An hour bounds that; HSTS, sent by
/// Moodle or the operator, is the lasting answer.
const REDIRECT_MAX_AGE: &str = "max-age=3600";

/// Answers every request with 308 Permanent Redirect to `https://{host}{path?query}`.
///
/// The host is the request's (`Host`, else the absolute URI's authority): the
/// gateway answers for Moodle's `wwwroot` under whatever name the student typed. Its
/// port is replaced by `https_port`, left out when that is 443. No host, several, or
/// one that is not a plain `host[:port]` gets a 400. 308 rather than 301 keeps the
/// method and body of a POST. Body: one line of text.
pub fn redirect_to_https(request: &Request<impl Any>, https_port: u16) -> Response<Full<Bytes>> {
    match https_location(request, https_port) {
        Some(location) => text_response(
            StatusCode::PERMANENT_REDIRECT,
            format!(
                "moved permanently to {}\n",
                location.to_str().unwrap_or("https")
            ),
            Some(location),
        ),
        None => text_response(
            StatusCode::BAD_REQUEST,
            "bad request: missing or invalid host\n".to_owned(),
            None,
        ),
    }
}

/// `https://host[:port]/path?query`, or `None` when the request names no usable host.
fn https_location<B>(request: &Request<B>, https_port: u16) -> Option<HeaderValue> {
    let host = request_host(request)?;
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let path = if path.starts_with('/') { path } else { "/" };
    let location = match https_port {
        443 => format!("https://{}{path}", host.host()),
        port => format!("https://{}:{port}{path}", host.host()),
    };
    HeaderValue::try_from(location).ok()
}

/// The one `Host` (RFC 9112: several is a 400), else the absolute-form authority.
/// `host[:port]` only: no user info, and a port, when there is one, that fits a `u16`
/// (`http` checks neither).
fn request_host<B>(request: &Request<B>) -> Option<Authority> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let raw = match (hosts.next(), hosts.next()) {
        (Some(host), None) => host.to_str().ok()?,
        (None, _) => request.uri().authority()?.as_str(),
        (Some(_), Some(_)) => return None,
    };
    let authority = Authority::from_str(raw).ok()?;
    let host = authority.host();
    let port = raw.strip_prefix(host)?;
    let port_ok = port.is_empty() || port.strip_prefix(':')?.parse::<u16>().is_ok();
    (!host.is_empty() && !raw.contains('@') && port_ok).then_some(authority)
}

fn text_response(
    status: StatusCode,
    body: String,
    location: Option<HeaderValue>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    let cache = match location {
        Some(location) => {
            headers.insert(header::LOCATION, location);
            REDIRECT_MAX_AGE
        }
        None => "no-store",
    };
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio_rustls::client::TlsStream as ClientStream;
    use tokio_rustls::TlsConnector;

    /// A unique temp directory, removed when the test ends.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = format!("moodle-gateway-tls-{}-{n}", std::process::id());
            let dir = std::env::temp_dir().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn write(&self, name: &str, contents: &str) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, contents).unwrap();
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A fresh self-signed certificate for "localhost": (cert PEM, key PEM, cert DER).
    fn generate() -> (String, String, CertificateDer<'static>) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let der = made.cert.der().clone();
        (made.cert.pem(), made.signing_key.serialize_pem(), der)
    }

    /// Writes a generated pair as cert.pem and key.pem.
    fn pair_in(dir: &TempDir) -> (PathBuf, PathBuf, CertificateDer<'static>) {
        let (cert, key, der) = generate();
        (
            dir.write("cert.pem", &cert),
            dir.write("key.pem", &key),
            der,
        )
    }

    /// A fresh pair in `dir`, served by a TLS echo server; its address and leaf DER.
    async fn serving_a_pair(
        dir: &TempDir,
        http2: bool,
    ) -> (std::net::SocketAddr, CertificateDer<'static>) {
        let (cert, key, der) = pair_in(dir);
        let certs = Certificates::load(&cert, &key).unwrap();
        (serve(server_config(certs, http2)).await, der)
    }

    fn load_err(cert: &Path, key: &Path) -> String {
        Certificates::load(cert, key).unwrap_err()
    }

    #[test]
    fn a_matching_pair_loads() {
        let dir = TempDir::new();
        let (cert, key, der) = pair_in(&dir);
        let certs = Certificates::load(&cert, &key).unwrap();
        assert_eq!(certs.current.load().cert, vec![der]);
    }

    /// The same P-256 key as SEC1 ("EC PRIVATE KEY", what `openssl ecparam
    /// -genkey` writes): ring's PKCS#8 wraps the SEC1 structure in a fixed
    /// 29-byte prefix, which this peels off.
    fn sec1_pem(pkcs8: &[u8]) -> String {
        use base64::Engine;
        assert_eq!(&pkcs8[27..29], &[0x04, 0x6d], "ring's P-256 PKCS#8 layout");
        let sec1 = base64::engine::general_purpose::STANDARD.encode(&pkcs8[29..]);
        let lines: Vec<&str> = sec1
            .as_bytes()
            .chunks(64)
            .map(|l| std::str::from_utf8(l).unwrap())
            .collect();
        format!(
            "-----BEGIN EC PRIVATE KEY-----\n{}\n-----END EC PRIVATE KEY-----\n",
            lines.join("\n")
        )
    }

    #[test]
    fn a_sec1_key_and_a_combined_file_load() {
        let dir = TempDir::new();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let cert = dir.write("cert.pem", &made.cert.pem());
        let key = dir.write("ec.key", &sec1_pem(&made.signing_key.serialize_der()));
        Certificates::load(&cert, &key).unwrap();
        // One file holding the chain and the key, as some ACME clients write it.
        let both = format!("{}{}", made.cert.pem(), made.signing_key.serialize_pem());
        let both = dir.write("both.pem", &both);
        Certificates::load(&both, &both).unwrap();
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = TempDir::new();
        let (cert, key, _) = pair_in(&dir);
        let missing = dir.0.join("absent.pem");
        let error = load_err(&missing, &key);
        assert!(error.starts_with(&format!("cannot read {}: no such file", missing.display())));
        let error = load_err(&cert, &missing);
        assert!(error.starts_with(&format!("cannot read {}: ", missing.display())));
    }

    #[test]
    fn a_file_without_pem_is_named() {
        let dir = TempDir::new();
        let (cert, key, _) = pair_in(&dir);
        let junk = dir.write("junk.pem", "this is not a certificate\n");
        let error = load_err(&junk, &key);
        assert_eq!(
            error,
            format!(
                "{}: no certificate found (expected a PEM chain, leaf first)",
                junk.display()
            )
        );
        let error = load_err(&cert, &junk);
        assert!(error.starts_with(&format!("{}: no unencrypted private key", junk.display())));
    }

    #[test]
    fn a_broken_pem_section_is_named() {
        let dir = TempDir::new();
        let (_, key, _) = pair_in(&dir);
        let broken = dir.write("cut.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n");
        let error = load_err(&broken, &key);
        assert!(
            error.starts_with(&format!("{}: not valid PEM: ", broken.display())),
            "{error}"
        );
    }

    #[test]
    fn a_chain_without_certificates_is_named() {
        let dir = TempDir::new();
        let (_, key, _) = pair_in(&dir);
        // A PEM file, but it holds only the key: an empty chain.
        let error = load_err(&key, &key);
        assert!(error.starts_with(&format!("{}: no certificate found", key.display())));
    }

    #[test]
    fn a_key_of_another_certificate_is_named() {
        let dir = TempDir::new();
        let (cert, _, _) = pair_in(&dir);
        let other_key = dir.write("other.key", &generate().1);
        let error = load_err(&cert, &other_key);
        assert_eq!(
            error,
            format!(
                "{}: the key does not match the first certificate of {}",
                other_key.display(),
                cert.display()
            )
        );
    }

    #[test]
    fn a_garbled_certificate_is_named() {
        let dir = TempDir::new();
        let (_, key, _) = pair_in(&dir);
        let garbled = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let garbled = dir.write("garbled.pem", garbled);
        let error = load_err(&garbled, &key);
        assert!(
            error.starts_with(&format!(
                "{}: the first certificate cannot be parsed",
                garbled.display()
            )),
            "{error}"
        );
    }

    #[test]
    fn a_broken_reload_keeps_the_old_certificate() {
        let dir = TempDir::new();
        let (cert, key, der) = pair_in(&dir);
        let certs = Certificates::load(&cert, &key).unwrap();
        std::fs::write(&cert, "half-written").unwrap();
        let error = certs.reload().unwrap_err();
        assert!(error.contains("no certificate found"), "{error}");
        assert_eq!(certs.current.load().cert, vec![der]);
    }

    /// A TLS server on 127.0.0.1:0 through [`acceptor`]: each connection first gets
    /// one byte, 1 when [`is_http2`] says HTTP/2, then everything it sends echoed.
    async fn serve(config: Arc<ServerConfig>) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let acceptor = acceptor(config);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let h2 = u8::from(is_http2(&tls));
                    let _ = tls.write_all(&[h2]).await;
                    let mut buf = [0u8; 64];
                    while let Ok(n @ 1..) = tls.read(&mut buf).await {
                        let _ = tls.write_all(&buf[..n]).await;
                    }
                });
            }
        });
        address
    }

    /// A client that trusts `roots` and offers `alpn`; a fresh config each time, so
    /// no session is resumed (a resumed TLS session shows no certificate).
    async fn connect(
        address: std::net::SocketAddr,
        roots: &[&CertificateDer<'static>],
        alpn: &[&[u8]],
    ) -> std::io::Result<ClientStream<TcpStream>> {
        connect_with(address, client(roots, alpn, rustls::ALL_VERSIONS)).await
    }

    fn client(
        roots: &[&CertificateDer<'static>],
        alpn: &[&[u8]],
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> rustls::ClientConfig {
        let mut store = rustls::RootCertStore::empty();
        for root in roots {
            store.add((*root).clone()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(store)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }

    async fn connect_with(
        address: std::net::SocketAddr,
        config: rustls::ClientConfig,
    ) -> std::io::Result<ClientStream<TcpStream>> {
        let tcp = TcpStream::connect(address).await?;
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    }

    /// The server's verdict byte: whether it saw HTTP/2.
    async fn server_saw_h2(stream: &mut ClientStream<TcpStream>) -> bool {
        stream.read_u8().await.unwrap() == 1
    }

    fn peer_leaf(stream: &ClientStream<TcpStream>) -> CertificateDer<'static> {
        stream.get_ref().1.peer_certificates().unwrap()[0].clone()
    }

    async fn echo(stream: &mut ClientStream<TcpStream>, message: &[u8]) -> Vec<u8> {
        stream.write_all(message).await.unwrap();
        let mut back = vec![0u8; message.len()];
        stream.read_exact(&mut back).await.unwrap();
        back
    }

    #[tokio::test]
    async fn alpn_picks_h2_when_offered_and_http1_otherwise() {
        let dir = TempDir::new();
        let (address, der) = serving_a_pair(&dir, true).await;

        let mut both = connect(address, &[&der], &[b"http/1.1", b"h2"])
            .await
            .unwrap();
        assert_eq!(both.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        assert!(server_saw_h2(&mut both).await);
        assert_eq!(peer_leaf(&both), der);

        let mut http1 = connect(address, &[&der], &[b"http/1.1"]).await.unwrap();
        assert_eq!(http1.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        assert!(!server_saw_h2(&mut http1).await);

        let mut none = connect(address, &[&der], &[]).await.unwrap();
        assert_eq!(none.get_ref().1.alpn_protocol(), None);
        assert!(!server_saw_h2(&mut none).await);
    }

    #[tokio::test]
    async fn a_tls12_only_client_still_gets_h2() {
        let dir = TempDir::new();
        let (address, der) = serving_a_pair(&dir, true).await;
        let old_client = client(&[&der], &[b"h2"], &[&rustls::version::TLS12]);
        let mut stream = connect_with(address, old_client).await.unwrap();
        let version = stream.get_ref().1.protocol_version();
        assert_eq!(version, Some(rustls::ProtocolVersion::TLSv1_2));
        assert!(server_saw_h2(&mut stream).await);
        assert_eq!(echo(&mut stream, b"ping").await, b"ping");
    }

    #[tokio::test]
    async fn without_http2_an_h2_only_client_is_refused() {
        let dir = TempDir::new();
        let (address, der) = serving_a_pair(&dir, false).await;

        let mut both = connect(address, &[&der], &[b"h2", b"http/1.1"])
            .await
            .unwrap();
        assert_eq!(both.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        assert!(!server_saw_h2(&mut both).await);

        // rustls answers a client offering none of our protocols with the fatal
        // `no_application_protocol` alert (RFC 7301 section 3.2).
        let error = connect(address, &[&der], &[b"h2"]).await.unwrap_err();
        assert!(
            error.to_string().contains("NoApplicationProtocol"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_reload_serves_new_handshakes_and_keeps_open_streams() {
        let dir = TempDir::new();
        let (cert, key, old) = pair_in(&dir);
        let certs = Certificates::load(&cert, &key).unwrap();
        let address = serve(server_config(certs.clone(), true)).await;
        let mut open = connect(address, &[&old], &[b"h2"]).await.unwrap();
        assert!(server_saw_h2(&mut open).await);

        let (new_cert, new_key, new) = generate();
        std::fs::write(&cert, new_cert).unwrap();
        std::fs::write(&key, new_key).unwrap();
        certs.reload().unwrap();

        let fresh = connect(address, &[&old, &new], &[b"h2"]).await.unwrap();
        assert_eq!(peer_leaf(&fresh), new);
        assert_eq!(peer_leaf(&open), old);
        assert_eq!(echo(&mut open, b"still here").await, b"still here");
    }

    #[tokio::test]
    async fn a_broken_reload_keeps_serving_the_old_certificate() {
        let dir = TempDir::new();
        let (cert, key, old) = pair_in(&dir);
        let certs = Certificates::load(&cert, &key).unwrap();
        let address = serve(server_config(certs.clone(), true)).await;

        std::fs::write(&key, generate().1).unwrap();
        let error = certs.reload().unwrap_err();
        assert!(error.contains("does not match"), "{error}");

        let stream = connect(address, &[&old], &[b"h2"]).await.unwrap();
        assert_eq!(peer_leaf(&stream), old);
    }

    /// How a client that keeps its sessions (`client`: clones share its store, as a
    /// browser's tabs do) got through its handshake with `address`.
    async fn handshake(
        address: std::net::SocketAddr,
        client: &rustls::ClientConfig,
    ) -> rustls::HandshakeKind {
        let mut stream = connect_with(address, client.clone()).await.unwrap();
        // TLS 1.3 tickets come after the handshake, before the server's first byte:
        // once it is read, they are stored for the next connection.
        server_saw_h2(&mut stream).await;
        stream.get_ref().1.handshake_kind().unwrap()
    }

    #[tokio::test]
    async fn a_returning_client_resumes_by_ticket_over_tls_1_3_and_1_2() {
        let dir = TempDir::new();
        let (cert, key, der) = pair_in(&dir);
        let config = server_config(Certificates::load(&cert, &key).unwrap(), true);
        // Another server with the same ticket key and no session cache at all: what
        // it resumes, it resumes by ticket alone.
        let mut stateless = (*config).clone();
        stateless.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        let (first, second) = (serve(config).await, serve(Arc::new(stateless)).await);
        for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
            let client = client(&[&der], &[b"http/1.1"], &[version]);
            assert_eq!(handshake(first, &client).await, rustls::HandshakeKind::Full);
            let again = handshake(second, &client).await;
            assert_eq!(again, rustls::HandshakeKind::Resumed, "{version:?}");
        }
    }

    #[tokio::test]
    async fn a_tls12_client_without_tickets_resumes_from_the_session_cache() {
        let dir = TempDir::new();
        let (address, der) = serving_a_pair(&dir, true).await;
        let mut client = client(&[&der], &[b"http/1.1"], &[&rustls::version::TLS12]);
        client.resumption = rustls::client::Resumption::default()
            .tls12_resumption(rustls::client::Tls12Resumption::SessionIdOnly);
        assert_eq!(
            handshake(address, &client).await,
            rustls::HandshakeKind::Full
        );
        let again = handshake(address, &client).await;
        assert_eq!(again, rustls::HandshakeKind::Resumed);
    }

    #[test]
    fn early_data_is_never_accepted() {
        // A replayed 0-RTT request could submit a quiz answer twice.
        let dir = TempDir::new();
        let (cert, key, _) = pair_in(&dir);
        let config = server_config(Certificates::load(&cert, &key).unwrap(), true);
        assert_eq!(config.max_early_data_size, 0);
        assert!(config.ticketer.enabled());
    }

    fn redirect(host: Option<&str>, uri: &str, https_port: u16) -> Response<Full<Bytes>> {
        let mut request = Request::builder().uri(uri);
        if let Some(host) = host {
            request = request.header(header::HOST, host);
        }
        redirect_to_https(&request.body(()).unwrap(), https_port)
    }

    fn location(response: &Response<Full<Bytes>>) -> &str {
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        response.headers()[header::LOCATION].to_str().unwrap()
    }

    #[test]
    fn redirect_keeps_host_path_and_query() {
        let response = redirect(Some("moodle.example.org"), "/course/view.php?id=7", 443);
        assert_eq!(
            location(&response),
            "https://moodle.example.org/course/view.php?id=7"
        );
        assert_eq!(response.headers()[header::CACHE_CONTROL], "max-age=3600");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
    }

    #[test]
    fn redirect_replaces_the_port_and_leaves_out_443() {
        let to_443 = redirect(Some("moodle.example.org:8080"), "/", 443);
        assert_eq!(location(&to_443), "https://moodle.example.org/");
        let to_8443 = redirect(Some("moodle.example.org:8080"), "/login/?a=b", 8443);
        assert_eq!(
            location(&to_8443),
            "https://moodle.example.org:8443/login/?a=b"
        );
        let no_port = redirect(Some("moodle.example.org"), "/", 8443);
        assert_eq!(location(&no_port), "https://moodle.example.org:8443/");
        let ipv6 = redirect(Some("[::1]:80"), "/x", 8443);
        assert_eq!(location(&ipv6), "https://[::1]:8443/x");
    }

    #[test]
    fn redirect_uses_the_absolute_uri_when_there_is_no_host_header() {
        let response = redirect(None, "http://moodle.example.org/my/?x=1", 443);
        assert_eq!(location(&response), "https://moodle.example.org/my/?x=1");
    }

    #[test]
    fn redirect_without_a_usable_host_is_a_bad_request() {
        for host in [
            None,
            Some(""),
            Some("user@evil.example"),
            Some("a b"),
            Some("h:99999"),
            Some("h:x"),
            Some("h:"),
        ] {
            let response = redirect(host, "/", 443);
            assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{host:?}");
            assert!(response.headers().get(header::LOCATION).is_none());
            assert_eq!(response.headers()[header::CACHE_CONTROL], "no-store");
        }
        let two_hosts = Request::builder()
            .header(header::HOST, "a.example")
            .header(header::HOST, "b.example")
            .body(())
            .unwrap();
        assert_eq!(
            redirect_to_https(&two_hosts, 443).status(),
            StatusCode::BAD_REQUEST
        );
    }
}

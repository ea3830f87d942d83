//! `[acme]`: opt-in, needs `[tls]` without files of its own, and every value an
//! admin can get wrong is named with its key and line.

use super::*;

const WWWROOT: &str = "[site]\nwwwroot = \"https://moodle.example.edu\"\n";
const TLS_HTTP01: &str = "[tls]\nredirect_listen = \"0.0.0.0:80\"\n";
const ACME: &str =
    "[acme]\ndirectory = \"https://acme.example/dir\"\ndomains = [\"moodle.example.edu\"]\n";

fn config(doc: &str) -> String {
    format!("listen = \"0.0.0.0:443\"\n{WWWROOT}{doc}\n{NODES}{DATA}")
}

#[test]
fn acme_serves_its_own_files_and_says_what_it_will_do() {
    let c = parse(&config(&format!("{TLS_HTTP01}{ACME}")), None).unwrap();
    let acme = c.acme.as_ref().unwrap();
    assert_eq!(acme.challenge, Challenge::Http01);
    assert_eq!(acme.renew_before, DEFAULT_RENEW_BEFORE);
    let tls = c.tls.as_ref().unwrap();
    assert_eq!(tls.cert, Path::new(DEFAULT_ACME_DIR).join("cert.pem"));
    assert_eq!(tls.key, Path::new(DEFAULT_ACME_DIR).join("key.pem"));
    let described = c.describe();
    let line = described.lines().find(|l| l.starts_with("acme: ")).unwrap();
    assert_eq!(
        line,
        "acme: certificates for moodle.example.edu from https://acme.example/dir (its HTTPS \
         checked against the system's roots), proved by http-01, answered by the redirect \
         listener (the CA asks port 80); account, cert.pem and key.pem kept in \
         /var/lib/moodle-gateway/acme (a placeholder until the first issuance); renewed 30days \
         before expiry; no contact email; this gateway's own certificate (no shared store)"
    );
}

#[test]
fn with_a_shared_store_check_says_the_site_orders_one_certificate_and_warns_of_tls_alpn() {
    const STORE: &str =
        "[store]\nkind = \"redis\"\nurl = \"redis://10.0.0.5:6379\"\nname = \"gw-a\"\n\
                         secret = \"0123456789abcdef0123456789abcdef\"\n";
    let acme_line = |doc: &str| {
        let described = parse(&config(doc), None).unwrap().describe();
        let line = described.lines().find(|l| l.starts_with("acme: ")).unwrap();
        line.to_owned()
    };
    let http01 = acme_line(&format!("{TLS_HTTP01}{STORE}{ACME}"));
    assert!(http01.ends_with(
        "no contact email; shared through Redis: one gateway orders at a time (a lease), every gateway answers \
         the CA's http-01 and serves the newest certificate (looked for every 15s)"
    ), "{http01}");
    let alpn = format!("[tls]\n{STORE}{ACME}challenge = \"tls-alpn-01\"\n");
    let line = acme_line(&alpn);
    assert!(
        line.contains("tls-alpn-01 is answered only by the gateway that orders")
            && line.contains("use http-01"),
        "{line}"
    );
}

#[test]
fn without_the_section_there_is_no_acme() {
    let c = parse(&format!("{NODES}{DATA}"), None).unwrap();
    assert!(c.acme.is_none());
    assert!(!c.describe().contains("acme"));
}

#[test]
fn acme_needs_tls_and_http01_needs_the_redirect_listener() {
    assert_eq!(
        errors(&config(ACME)),
        "4: acme: [acme] needs a [tls] section: the certificate it gets is served there\n\
         4: acme.challenge: http-01 needs tls.redirect_listen on port 80: the CA asks there; \
         set it, or use challenge = \"tls-alpn-01\""
    );
    let alpn = format!("[tls]\n{ACME}challenge = \"tls-alpn-01\"\n");
    assert!(parse(&config(&alpn), None).is_ok());
}

#[test]
fn files_beside_acme_are_refused() {
    let doc = format!("{TLS_HTTP01}cert = \"fullchain.pem\"\n{ACME}");
    assert_eq!(
        errors(&config(&doc)),
        "6: tls.cert: [acme] gets the certificate and keeps it in acme.dir: remove this key, \
         or remove [acme] to serve files"
    );
}

#[test]
fn every_bad_value_names_its_key() {
    let doc = "[tls]\nredirect_listen = \"0.0.0.0:80\"\n[acme]\n\
               directory = \"http://acme.example/dir\"\n\
               domains = [\"*.example.edu\", \"a b\", \"ok.example\", \"OK.example\"]\n\
               contact = \"mailto:me@example.edu\"\nchallenge = \"dns-01\"\n\
               renew_before = \"10m\"\n";
    assert_eq!(
        errors(&config(doc)),
        "7: acme.directory: \"http://acme.example/dir\" is not an https:// URL (like \
         \"https://acme-v02.api.letsencrypt.org/directory\")\n\
         8: acme.domains[0]: \"*.example.edu\" is a wildcard: only DNS-01 proves those, and the \
         gateway answers http-01 or tls-alpn-01\n\
         8: acme.domains[1]: \"a b\" is not a DNS name\n\
         8: acme.domains[3]: \"ok.example\" is listed twice\n\
         9: acme.contact: \"mailto:me@example.edu\" is not an email address (like \
         \"moodle-admin@school.example\", without mailto:)\n\
         10: acme.challenge: unknown challenge \"dns-01\": use \"http-01\" or \"tls-alpn-01\"\n\
         11: acme.renew_before: \"10m\" is under an hour: renewing that late risks an expired \
         certificate"
    );
    let missing = "[tls]\nredirect_listen = \"0.0.0.0:80\"\n[acme]\ndomains = []\n";
    assert_eq!(
        errors(&config(missing)),
        "6: acme.directory: missing required key\n7: acme.domains: must name at least one domain"
    );
}

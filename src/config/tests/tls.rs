//! `[tls]`: the files are found relative to the config file and must hold PEM
//! blocks of the right kind; the redirect listener needs a port of its own.
//! The files here are armour around nonsense: the config only reads the armour.

use super::*;

const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIBdummy\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIEdummy\n-----END PRIVATE KEY-----\n";

/// A fresh directory holding `files`, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str, files: &[(&str, &str)]) -> Dir {
        let dir =
            std::env::temp_dir().join(format!("moodle-gateway-tls-{}-{name}", std::process::id()));
        fs::remove_dir_all(&dir).ok();
        fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            fs::write(dir.join(file), text).unwrap();
        }
        Dir(dir)
    }

    /// `doc` followed by a valid `[[nodes]]` and `[data]`, read from this directory.
    fn parse(&self, doc: &str) -> Result<Config, ConfigErrors> {
        let text = format!("{doc}\n{NODES}{DATA}");
        Config::parse(&text, &self.0, ConfigEnv::default())
    }

    /// The errors for `doc`, one `<line>: <key>: <message>` per line, with this
    /// directory's path written as `DIR`.
    fn errors(&self, doc: &str) -> String {
        let errors = self.parse(doc).expect_err("config should be rejected");
        errors
            .to_string()
            .replace(&self.0.display().to_string(), "DIR")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        fs::remove_dir_all(&self.0).ok();
    }
}

#[test]
fn tls_is_off_without_its_section() {
    let dir = Dir::new("off", &[]);
    assert!(dir.parse("").unwrap().tls.is_none());
}

#[test]
fn tls_files_are_resolved_against_the_config_directory() {
    let dir = Dir::new("on", &[("cert.pem", CERT), ("key.pem", KEY)]);
    let c = dir
        .parse("[tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"")
        .unwrap();
    let tls = c.tls.clone().unwrap();
    assert_eq!(tls.cert, dir.0.join("cert.pem"));
    assert_eq!(tls.key, dir.0.join("key.pem"));
    assert_eq!(tls.redirect_listen, None);
    let shown = c.describe().replace(&dir.0.display().to_string(), "DIR");
    let want = "tls: on (HTTP/2 and HTTP/1.1), cert DIR/cert.pem, key DIR/key.pem; \
                no redirect listener; no Strict-Transport-Security\n";
    assert!(shown.contains(want), "{shown}");
    let abs = dir.0.join("cert.pem").display().to_string();
    let doc = format!("[tls]\ncert = {abs:?}\nkey = \"key.pem\"\nredirect_listen = \"0.0.0.0:80\"");
    let c = dir.parse(&doc).unwrap();
    let tls = c.tls.clone().unwrap();
    assert_eq!(tls.cert.display().to_string(), abs);
    assert_eq!(tls.redirect_listen, Some("0.0.0.0:80".parse().unwrap()));
    let want = "; plain HTTP on 0.0.0.0:80 is redirected to https;";
    assert!(c.describe().contains(want), "{}", c.describe());
}

#[test]
fn every_private_key_armour_is_accepted_but_an_encrypted_one() {
    let chain = format!("{CERT}{CERT}");
    for label in ["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"] {
        let key = format!("junk before\n-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
        let dir = Dir::new("kinds", &[("chain.pem", &chain), ("key.pem", &key)]);
        let tls = dir.parse("tls = { cert = \"chain.pem\", key = \"key.pem\" }");
        assert!(tls.unwrap().tls.is_some(), "for {label}");
    }
}

#[test]
fn tls_problems() {
    let encrypted =
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
    let dir = Dir::new(
        "problems",
        &[
            ("cert.pem", CERT),
            ("key.pem", KEY),
            ("empty.pem", ""),
            ("enc.pem", encrypted),
            ("cert.der", "\u{30}\u{82}binary"),
        ],
    );
    assert_eq!(
        dir.errors("[tls]"),
        "1: tls.cert: missing required key\n1: tls.key: missing required key"
    );
    assert_eq!(
        dir.errors("[tls]\ncert = \"key.pem\"\nkey = \"cert.pem\"\nport = 443"),
        "2: tls.cert: DIR/key.pem holds a private key, not a certificate: are cert and key swapped?\n\
         3: tls.key: DIR/cert.pem holds a certificate, not a private key: are cert and key swapped?\n\
         4: tls.port: unknown key (expected one of: cert, key, redirect_listen, hsts_max_age, \
         hsts_include_subdomains)"
    );
    assert_eq!(
        dir.errors("[tls]\ncert = \"cert.der\"\nkey = \"enc.pem\""),
        "2: tls.cert: DIR/cert.der has no PEM certificate (a \"-----BEGIN CERTIFICATE-----\" block)\n\
         3: tls.key: DIR/enc.pem holds an encrypted private key: the gateway cannot ask for a \
         passphrase (decrypt it with: openssl pkey -in KEY -out KEY.plain)"
    );
    assert_eq!(
        dir.errors("[tls]\ncert = \"cert.pem\"\nkey = \"empty.pem\""),
        "3: tls.key: DIR/empty.pem has no PEM private key (a \"-----BEGIN PRIVATE KEY-----\" block)"
    );
    let missing = dir.errors("[tls]\ncert = \"nope.pem\"\nkey = \".\"");
    assert!(
        missing.starts_with("2: tls.cert: cannot read DIR/nope.pem: no such file or directory"),
        "{missing}"
    );
    assert!(
        missing.contains("\n3: tls.key: cannot read DIR/.: is a directory"),
        "{missing}"
    );
    assert_eq!(
        dir.errors("tls = \"on\""),
        "1: tls: expected a table, found string"
    );
    assert_eq!(
        dir.errors("[tls]\ncert = 1\nkey = \"key.pem\""),
        "2: tls.cert: expected a string, found integer"
    );
}

#[test]
fn the_redirect_listener_needs_a_port_of_its_own() {
    let dir = Dir::new("redirect", &[("cert.pem", CERT), ("key.pem", KEY)]);
    let tls = "[tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\nredirect_listen";
    assert_eq!(
        dir.errors(&format!(
            "listen = \"0.0.0.0:443\"\n{tls} = \"127.0.0.1:443\""
        )),
        "5: tls.redirect_listen: 127.0.0.1:443 clashes with the public listen 0.0.0.0:443"
    );
    assert_eq!(
        dir.errors(&format!(
            "[admin]\nlisten = \"[::]:9090\"\ntoken = \"0123456789abcdef0123456789abcdef\"\n{tls} = \"10.0.0.1:9090\""
        )),
        "7: tls.redirect_listen: 10.0.0.1:9090 clashes with admin.listen [::]:9090"
    );
    // The admin listener is known even when the admin token is not valid.
    let doc = format!("[admin]\ntoken = \"\"\n{tls} = \"127.0.0.1:9090\"");
    assert_eq!(
        dir.errors(&doc).replace("\n", " | "),
        "2: admin.token: must not be empty | \
         6: tls.redirect_listen: 127.0.0.1:9090 clashes with admin.listen 127.0.0.1:9090"
    );
    assert_eq!(
        dir.errors(&format!("{tls} = \"80\"")),
        "4: tls.redirect_listen: \"80\" is not an ip:port address (like \"0.0.0.0:8080\")"
    );
    let c = dir
        .parse(&format!("listen = \"0.0.0.0:443\"\n{tls} = \"[::]:80\""))
        .unwrap();
    assert_eq!(
        c.tls.unwrap().redirect_listen,
        Some("[::]:80".parse().unwrap())
    );
}

#[test]
fn hsts_is_off_unless_a_max_age_is_given() {
    let dir = Dir::new("hsts", &[("cert.pem", CERT), ("key.pem", KEY)]);
    let files = "[tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n";
    assert_eq!(dir.parse(files).unwrap().tls.unwrap().hsts, None);
    let c = dir
        .parse(&format!("{files}hsts_max_age = \"365d\""))
        .unwrap();
    let hsts = c.tls.clone().unwrap().hsts.unwrap();
    assert_eq!(hsts.value(), "max-age=31536000");
    assert!(c
        .describe()
        .contains("; Strict-Transport-Security: max-age=31536000\n"));
    let both = format!("{files}hsts_max_age = \"2h\"\nhsts_include_subdomains = true");
    let hsts = dir.parse(&both).unwrap().tls.unwrap().hsts.unwrap();
    assert_eq!(hsts.value(), "max-age=7200; includeSubDomains");
    // Zero is how a site that turned HSTS on tells browsers to forget it.
    let forget = dir.parse(&format!("{files}hsts_max_age = \"0s\"")).unwrap();
    assert_eq!(forget.tls.unwrap().hsts.unwrap().value(), "max-age=0");
    let preload = dir
        .parse(&format!("{files}hsts_max_age = \"730d\""))
        .unwrap();
    assert_eq!(
        preload.tls.unwrap().hsts.unwrap().value(),
        "max-age=63072000"
    );
}

#[test]
fn hsts_problems_name_the_key() {
    let dir = Dir::new("hsts-bad", &[("cert.pem", CERT), ("key.pem", KEY)]);
    let files = "[tls]\ncert = \"cert.pem\"\nkey = \"key.pem\"\n";
    assert_eq!(
        dir.errors(&format!("{files}hsts_include_subdomains = true")),
        "4: tls.hsts_include_subdomains: needs tls.hsts_max_age: without it no \
         Strict-Transport-Security is sent"
    );
    let errors = dir.errors(&format!(
        "{files}hsts_max_age = 31536000\nhsts_include_subdomains = \"yes\""
    ));
    assert!(
        errors.starts_with("4: tls.hsts_max_age: expected a duration string"),
        "{errors}"
    );
    assert!(
        errors.contains("5: tls.hsts_include_subdomains: expected true or false, found string"),
        "{errors}"
    );
}

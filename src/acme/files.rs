//! What ACME keeps in `acme.dir`: the account (`account.json`), the certificate
//! chain (`cert.pem`) and its key (`key.pem`), the last two being what `[tls]`
//! serves and a `SIGHUP` re-reads.
//!
//! Every file is written beside its place and renamed over it, so a reader (the
//! gateway's own reload, a backup) never sees half a file; the key and the
//! account are readable by the gateway's user alone.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use instant_acme::AccountCredentials;
use serde::{Deserialize, Serialize};

use crate::config::AcmeConfig;

/// `account.json`: the credentials and the CA they belong to, so a changed
/// `acme.directory` opens a new account instead of presenting a foreign one.
#[derive(Serialize, Deserialize)]
pub(super) struct SavedAccount {
    pub(super) directory: String,
    pub(super) credentials: AccountCredentials,
}

/// Makes `acme.dir` (owner only) and, before the first issuance, a placeholder
/// pair there, so the TLS listener can start and the CA can reach it.
///
/// The placeholder is self-signed and expired (1975): no browser trusts it, and
/// the renewal sees it due at once.
pub fn prepare(config: &AcmeConfig) -> Result<(), String> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&config.dir)
        .map_err(|e| format!("acme.dir: cannot create {}: {e}", config.dir.display()))?;
    if config.cert_path().exists() && config.key_path().exists() {
        return Ok(());
    }
    let key = rcgen::KeyPair::generate().map_err(|e| format!("placeholder key: {e}"))?;
    let mut params = rcgen::CertificateParams::new(config.domains.clone())
        .map_err(|e| format!("placeholder certificate: {e}"))?;
    params.not_before = rcgen::date_time_ymd(1975, 1, 1);
    params.not_after = rcgen::date_time_ymd(1975, 1, 2);
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("placeholder certificate: {e}"))?;
    write_pair(config, &cert.pem(), &key.serialize_pem())
}

/// The new certificate and key, key first: between the two renames a reload
/// finds a pair that does not match, refuses it and keeps the old one.
pub(super) fn write_pair(config: &AcmeConfig, chain: &str, key: &str) -> Result<(), String> {
    write_atomically(&config.key_path(), key.as_bytes(), 0o600)?;
    write_atomically(&config.cert_path(), chain.as_bytes(), 0o644)
}

/// `account.json`'s text, if there is one.
pub(super) fn read_account_text(config: &AcmeConfig) -> Option<Vec<u8>> {
    fs::read(config.account_path()).ok()
}

/// The credentials in an account's `text` (from the file or the site's store),
/// if they are this CA's.
pub(super) fn parse_account(config: &AcmeConfig, text: &[u8]) -> Option<AccountCredentials> {
    let saved: SavedAccount = match serde_json::from_slice(text) {
        Ok(saved) => saved,
        Err(error) => {
            let path = config.account_path();
            tracing::warn!(
                "{}: unreadable, a new account is made: {error}",
                path.display()
            );
            return None;
        }
    };
    (saved.directory == config.directory).then_some(saved.credentials)
}

/// The text `account.json` keeps for `credentials` at this CA.
pub(super) fn account_text(
    config: &AcmeConfig,
    credentials: AccountCredentials,
) -> Result<Vec<u8>, String> {
    let saved = SavedAccount {
        directory: config.directory.clone(),
        credentials,
    };
    serde_json::to_vec_pretty(&saved).map_err(|e| format!("account: {e}"))
}

pub(super) fn write_account_text(config: &AcmeConfig, text: &[u8]) -> Result<(), String> {
    write_atomically(&config.account_path(), text, 0o600)
}

fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), String> {
    let fresh = path.with_extension("new");
    let write = || -> std::io::Result<()> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&fresh)?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&fresh, path)
    };
    write().map_err(|e| format!("cannot write {}: {e}", path.display()))
}

//! One certificate from the CA (RFC 8555 section 7): the account, an order for
//! every name, a challenge answered per name, the signing request, the chain.

use instant_acme::{
    Account, AccountBuilder, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier,
    NewAccount, NewOrder, OrderStatus, RetryPolicy,
};

use super::files;
use super::Acme;
use crate::config::{AcmeConfig, Challenge};

/// What the CA issued: the PEM chain, leaf first, and the key made for it.
pub(super) struct Issued {
    pub(super) chain: String,
    pub(super) key: String,
}

/// The site's account (in Redis with a shared store), the one saved in
/// `acme.dir`, or a new one (saved at once: a CA limits how many accounts an
/// address may open).
pub(super) async fn account(acme: &Acme) -> Result<Account, String> {
    let config = &acme.config;
    if let Some(credentials) = saved_account(acme).await {
        return builder(config)?
            .from_credentials(credentials)
            .await
            .map_err(|e| format!("the saved ACME account: {e}"));
    }
    let contact = config.contact.as_ref().map(|c| format!("mailto:{c}"));
    let contact: Vec<&str> = contact.iter().map(String::as_str).collect();
    let new = NewAccount {
        contact: &contact,
        terms_of_service_agreed: true,
        only_return_existing: false,
    };
    let (account, credentials) = builder(config)?
        .create(&new, config.directory.clone(), None)
        .await
        .map_err(|e| format!("cannot open an account at {}: {e}", config.directory))?;
    let text = files::account_text(config, credentials)?;
    files::write_account_text(config, &text)?;
    if let Some(sharing) = &acme.sharing {
        sharing.keep_account(&text).await;
    }
    tracing::info!(directory = %config.directory, "ACME account opened");
    Ok(account)
}

/// With a shared store, the site's account, also written to `acme.dir`; else
/// (or when Redis has none) the file's, offered to the other gateways.
async fn saved_account(acme: &Acme) -> Option<AccountCredentials> {
    let config = &acme.config;
    let site = match &acme.sharing {
        Some(sharing) => sharing.account().await,
        None => None,
    };
    if let Some(text) = site {
        if let Some(credentials) = files::parse_account(config, &text) {
            if let Err(error) = files::write_account_text(config, &text) {
                tracing::warn!("the site's ACME account is used but not kept here: {error}");
            }
            return Some(credentials);
        }
    }
    let text = files::read_account_text(config)?;
    let credentials = files::parse_account(config, &text)?;
    if let Some(sharing) = &acme.sharing {
        sharing.keep_account(&text).await;
    }
    Some(credentials)
}

/// The HTTPS client to the CA: the system's roots, or `directory_ca`'s alone.
fn builder(config: &AcmeConfig) -> Result<AccountBuilder, String> {
    // The client builds its rustls config from the process's provider: ring, as
    // everywhere in the gateway. An error means one is set already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let built = match &config.directory_ca {
        Some(root) => Account::builder_with_root(root),
        None => Account::builder(),
    };
    built.map_err(|e| format!("ACME client: {e}"))
}

/// Orders a certificate for every `acme.domains` and answers the challenges,
/// closing each one whatever the outcome.
pub(super) async fn issue(acme: &Acme, account: &Account) -> Result<Issued, String> {
    let config = &acme.config;
    let identifiers: Vec<Identifier> = config
        .domains
        .iter()
        .map(|d| Identifier::Dns(d.clone()))
        .collect();
    let mut order = account
        .new_order(&NewOrder::new(&identifiers))
        .await
        .map_err(|e| format!("new order: {e}"))?;
    let mut opened = Vec::new();
    let answered = answer_challenges(acme, &mut order, &mut opened).await;
    let ready = match answered {
        Ok(()) => order
            .poll_ready(&RetryPolicy::default())
            .await
            .map_err(|e| format!("validation: {e}")),
        Err(e) => Err(e),
    };
    for (token, name) in opened {
        acme.close(&token, &name).await;
    }
    match ready? {
        OrderStatus::Ready => {}
        status => {
            return Err(format!(
                "the CA did not validate the names: order {status:?}"
            ))
        }
    }
    let key = order
        .finalize()
        .await
        .map_err(|e| format!("finalize: {e}"))?;
    let chain = order
        .poll_certificate(&RetryPolicy::default())
        .await
        .map_err(|e| format!("certificate: {e}"))?;
    Ok(Issued { chain, key })
}

/// Puts up each pending name's answer and tells the CA to look; `opened` lists
/// what to take down afterwards (the HTTP-01 token, the TLS-ALPN-01 name).
async fn answer_challenges(
    acme: &Acme,
    order: &mut instant_acme::Order,
    opened: &mut Vec<(String, String)>,
) -> Result<(), String> {
    let kind = match acme.config.challenge {
        Challenge::Http01 => ChallengeType::Http01,
        Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
    };
    let mut authorizations = order.authorizations();
    while let Some(authorization) = authorizations.next().await {
        let mut authorization = authorization.map_err(|e| format!("authorization: {e}"))?;
        match authorization.status {
            AuthorizationStatus::Pending => {}
            // The account proved this name recently; nothing to answer.
            AuthorizationStatus::Valid => continue,
            status => return Err(format!("authorization {status:?}")),
        }
        let name = authorization.identifier().to_string();
        let mut challenge = authorization.challenge(kind.clone()).ok_or_else(|| {
            format!(
                "the CA offers no {} challenge for {name}",
                acme.config.challenge.name()
            )
        })?;
        let token = challenge.token.clone();
        acme.open(&token, &name, &challenge.key_authorization())
            .await?;
        opened.push((token, name));
        challenge
            .set_ready()
            .await
            .map_err(|e| format!("challenge: {e}"))?;
    }
    Ok(())
}

//! The site's TLS ticket keys in Redis, one a period: made by the first gateway
//! that asks (`SET NX`), read by every other, gone a day later (`PX`). The store
//! keeps them as it is given them (sealed under `store.secret` by the caller) and
//! knows nothing of TLS.

use std::time::Duration;

use super::Store;

/// How long a period's key stays: made up to a period ahead, it seals for one
/// and opens tickets for the two after (their lifetime), with a period to spare.
const KEEP: Duration = Duration::from_secs(4 * 6 * 3600);

impl Store {
    /// The keys of periods `period - 2 ..= period + 1` (the tickets still alive,
    /// and the next, made ahead so that every gateway has it at the turn), as
    /// Redis holds them; a period without one gets `fresh()`'s, unless another
    /// gateway's came first. `None` without a shared store, or with Redis away.
    pub async fn ticket_keys(
        &self,
        period: u64,
        fresh: impl Fn() -> Option<Vec<u8>>,
    ) -> Option<Vec<(u64, Vec<u8>)>> {
        let shared = self.0.as_ref()?;
        let periods: Vec<u64> = (period.saturating_sub(2)..=period + 1).collect();
        let mut pipe = redis::pipe();
        for made in [period, period + 1] {
            let key = fresh()?;
            pipe.cmd("SET")
                .arg(shared.keys.ticket_key(made))
                .arg(key)
                .arg("NX")
                .arg("PX")
                .arg(KEEP.as_millis() as u64)
                .ignore();
        }
        let names: Vec<String> = periods.iter().map(|p| shared.keys.ticket_key(*p)).collect();
        pipe.cmd("MGET").arg(&names);
        let (values,): (Vec<Option<Vec<u8>>>,) = shared
            .ask(
                None,
                |mut conn| async move { pipe.query_async(&mut conn).await },
            )
            .await?;
        let found = periods.into_iter().zip(values);
        Some(found.filter_map(|(p, v)| Some((p, v?))).collect())
    }
}

/// How often the keys are read again once they have been: a period's key is made
/// a period ahead, so a gateway this late at the turn still has it.
const EVERY: Duration = Duration::from_secs(60);

/// How often they are asked for until Redis first answers.
const UNTIL_FIRST: Duration = Duration::from_secs(1);

impl Store {
    /// Hands `install` the keys around `period()` ([`Store::ticket_keys`]) as soon
    /// as Redis answers and every minute after (`EVERY`), until `stop`.
    pub async fn keep_ticket_keys(
        &self,
        period: impl Fn() -> u64,
        fresh: impl Fn() -> Option<Vec<u8>>,
        install: impl Fn(Vec<(u64, Vec<u8>)>),
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            let pause = match self.ticket_keys(period(), &fresh).await {
                Some(keys) => {
                    install(keys);
                    EVERY
                }
                None => UNTIL_FIRST,
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
        }
    }
}

use super::*;

const YIELD_AT: f64 = 1.5;
const PATIENCE: Duration = Duration::from_secs(180);

/// A second of five page turns of `ms` each, then the clock past its end.
async fn a_second_of_turns(site: &SiteStarts, ms: u64) {
    for _ in 0..5 {
        site.turn_took(YIELD_AT, Duration::from_millis(ms));
    }
    tokio::time::advance(Duration::from_millis(1001)).await;
}

/// The turns' calm: a few seconds of 100 ms turns with no start running.
async fn calm_of_100ms(site: &SiteStarts) {
    for _ in 0..3 {
        a_second_of_turns(site, 100).await;
    }
    // The next turn closes the last calm second.
    site.turn_took(YIELD_AT, Duration::from_millis(100));
}

async fn start(site: &SiteStarts) -> SitePermit {
    site.enter(YIELD_AT, Instant::now(), PATIENCE)
        .await
        .unwrap()
}

async fn starts(site: &SiteStarts, n: usize) -> Vec<SitePermit> {
    let mut running = Vec::new();
    for _ in 0..n {
        running.push(start(site).await);
    }
    running
}

/// A start that waits, in a task of its own, once it is waiting.
async fn waiting_start(
    site: &Arc<SiteStarts>,
) -> tokio::task::JoinHandle<Result<SitePermit, Ended>> {
    let starts = site.clone();
    spawned_until_it_waits(site, async move {
        starts.enter(YIELD_AT, Instant::now(), PATIENCE).await
    })
    .await
}

/// `task` (one that asks `site` for a start) spawned, once its start waits.
async fn spawned_until_it_waits<T: Send + 'static>(
    site: &SiteStarts,
    task: impl std::future::Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let before = site.now().waiting;
    let waiter = tokio::spawn(task);
    while site.now().waiting == before {
        tokio::task::yield_now().await;
    }
    waiter
}

/// A second of turns of `ms` each, closed by one more turn.
async fn a_closed_second_of_turns(site: &SiteStarts, ms: u64) {
    a_second_of_turns(site, ms).await;
    site.turn_took(YIELD_AT, Duration::from_millis(ms));
}

/// Whether a start asking now gets in at once (and goes at once).
async fn gets_in_at_once(site: &SiteStarts) -> bool {
    site.enter(YIELD_AT, Instant::now(), Duration::ZERO)
        .await
        .is_ok()
}

#[tokio::test(start_paused = true)]
async fn before_any_calm_is_seen_starts_go_as_the_nodes_gates_let_them() {
    let site = SiteStarts::default();
    let mut running = Vec::new();
    for _ in 0..20 {
        running.push(start(&site).await);
        a_second_of_turns(&site, 900).await;
    }
    assert!(running.iter().all(|p| !p.waited));
    assert_eq!(site.now().calm, None, "no second free of starts");
    assert_eq!(site.now().limit, None, "nothing to compare the turns with");
    assert_eq!(site.now().running, 20);
}

#[tokio::test(start_paused = true)]
async fn a_wave_begins_with_one_start_doubles_while_the_turns_stay_calm_and_halves_when_they_slow()
{
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    assert_eq!(site.now().calm, Some(Duration::from_millis(100)));
    assert_eq!(site.now().limit, Some(1), "a wave begins with one start");
    let mut running = vec![start(&site).await];
    let second = waiting_start(&site).await;
    // The turns stay calm while a start waits: two at once, then four.
    a_closed_second_of_turns(&site, 100).await;
    assert_eq!(site.now().limit, Some(2));
    running.push(second.await.unwrap().unwrap());
    let waiters = [waiting_start(&site).await, waiting_start(&site).await];
    a_closed_second_of_turns(&site, 100).await;
    assert_eq!(site.now().limit, Some(4));
    for waiter in waiters {
        running.push(waiter.await.unwrap().unwrap());
    }
    // Four run and the turns take twice their calm: two at once.
    let fifth = waiting_start(&site).await;
    a_closed_second_of_turns(&site, 200).await;
    assert_eq!(site.now().limit, Some(2));
    // The first two starts to finish pay for the halving; the third frees a place.
    running.pop();
    running.pop();
    tokio::task::yield_now().await;
    assert_eq!(site.now().waiting, 1, "two run, two allowed");
    running.pop();
    running.push(fifth.await.unwrap().unwrap());
    // Still slow with two running: one at once, never none.
    a_closed_second_of_turns(&site, 200).await;
    assert_eq!(site.now().limit, Some(1));
    // The turns recover while a start waits: having slowed in this wave, the
    // share grows by one, not twice.
    let sixth = waiting_start(&site).await;
    a_closed_second_of_turns(&site, 100).await;
    assert_eq!(site.now().limit, Some(2));
    drop(running);
    let sixth = sixth.await.unwrap().unwrap();
    drop(sixth);
    // The second it ran in, then a quiet one: the next wave begins with one again.
    a_closed_second_of_turns(&site, 100).await;
    assert_eq!(site.now().limit, Some(2));
    a_closed_second_of_turns(&site, 100).await;
    assert_eq!(site.now().limit, Some(1));
}

#[tokio::test(start_paused = true)]
async fn turns_within_the_margin_hold_the_share_where_it_is() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    // No turns for a while: four start at once, then the turns slow: two.
    tokio::time::advance(UNSEEN + Duration::from_secs(1)).await;
    let mut running = starts(&site, 4).await;
    tokio::time::advance(Duration::from_millis(1001)).await;
    a_closed_second_of_turns(&site, 200).await;
    assert_eq!(site.now().limit, Some(2));
    running.truncate(2);
    let waiter = waiting_start(&site).await;
    // At 1.4 × calm, between the margins, neither halved nor grown.
    for _ in 0..5 {
        a_closed_second_of_turns(&site, 140).await;
    }
    assert_eq!(site.now().limit, Some(2), "1.4 × calm: between the margins");
    assert_eq!(site.now().waiting, 1);
    waiter.abort();
}

#[tokio::test(start_paused = true)]
async fn turns_that_stall_keep_the_share_where_it_is() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let _running = start(&site).await;
    let waiter = waiting_start(&site).await;
    // The turns slow to one a second, each taking two: too few to weigh, and
    // not a sign that nobody is at work.
    for _ in 0..10 {
        site.turn_took(YIELD_AT, Duration::from_secs(2));
        tokio::time::advance(Duration::from_millis(1001)).await;
    }
    site.turn_took(YIELD_AT, Duration::from_secs(2));
    assert_eq!(site.now().limit, Some(1));
    assert_eq!(site.now().waiting, 1);
    waiter.abort();
}

#[tokio::test(start_paused = true)]
async fn a_calm_not_refreshed_for_a_minute_is_forgotten_and_the_nodes_gates_decide() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    // Starts never stop: no second is free of them to refresh the calm.
    let _running = start(&site).await;
    for _ in 0..CALM_KEPT.as_secs() {
        a_second_of_turns(&site, 130).await;
    }
    site.turn_took(YIELD_AT, Duration::from_millis(130));
    assert_eq!(site.now().calm, None);
    assert_eq!(site.now().limit, None);
}

#[tokio::test(start_paused = true)]
async fn a_start_that_waited_a_quarter_of_its_patience_opens_a_place_whatever_the_turns_say() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let running = start(&site).await;
    let patience = Duration::from_secs(8);
    let waiter = {
        let site = site.clone();
        tokio::spawn(async move { site.enter(YIELD_AT, Instant::now(), patience).await })
    };
    while site.now().waiting == 0 {
        tokio::task::yield_now().await;
    }
    // The turns stay slow while it waits two seconds, a quarter of its patience.
    a_second_of_turns(&site, 400).await;
    a_second_of_turns(&site, 400).await;
    assert_eq!(site.now().limit, Some(1));
    drop(running);
    let waited = waiter.await.unwrap().unwrap();
    assert!(waited.waited);
    // Having waited long, it opens one more place at the next second's close,
    // though the turns are still slow.
    a_closed_second_of_turns(&site, 400).await;
    assert_eq!(site.now().limit, Some(2));
    drop(waited);
}

#[tokio::test(start_paused = true)]
async fn starts_waiting_go_in_the_order_they_came() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let first = start(&site).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for name in ["second", "third", "fourth"] {
        let (starts, tx) = (site.clone(), tx.clone());
        let task = spawned_until_it_waits(&site, async move {
            let permit = starts
                .enter(YIELD_AT, Instant::now(), PATIENCE)
                .await
                .unwrap();
            tx.send(name).unwrap();
            drop(permit);
        });
        tasks.push(task.await);
    }
    drop(first);
    for task in tasks {
        task.await.unwrap();
    }
    let order: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert_eq!(order, ["second", "third", "fourth"]);
}

#[tokio::test(start_paused = true)]
async fn turned_off_it_holds_no_start_and_forgets_its_share() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let _running = start(&site).await;
    assert_eq!(site.now().limit, Some(1));
    let off = site
        .enter(0.0, Instant::now(), Duration::ZERO)
        .await
        .unwrap();
    assert!(!off.waited);
    assert_eq!(site.now().limit, None);
    assert!(gets_in_at_once(&site).await);
}

#[tokio::test(start_paused = true)]
async fn a_halving_not_yet_felt_is_not_halved_again_and_a_widening_first_pays_what_is_owed() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    // No turns for a while: as wide as the nodes' gates, and four start at once.
    tokio::time::advance(UNSEEN + Duration::from_secs(1)).await;
    let mut running = starts(&site, 4).await;
    assert_eq!(site.now().limit, None);
    tokio::time::advance(Duration::from_millis(1001)).await;
    a_closed_second_of_turns(&site, 200).await;
    assert_eq!(site.now().limit, Some(2));
    // Four still run, two allowed: the turns cannot have felt the halving yet.
    a_closed_second_of_turns(&site, 200).await;
    assert_eq!(site.now().limit, Some(2), "held until the halving is felt");
    // A start waits; the turns recover: one more place, taken from what the
    // running starts owe, so nobody new gets in yet.
    let waiter = waiting_start(&site).await;
    a_closed_second_of_turns(&site, 100).await;
    assert_eq!(site.now().limit, Some(3));
    running.pop();
    tokio::task::yield_now().await;
    assert_eq!(site.now().waiting, 1, "three run, three allowed");
    running.pop();
    let let_in = waiter.await.unwrap().unwrap();
    assert!(let_in.waited);
    assert_eq!(site.now().running, 3);
}

#[tokio::test(start_paused = true)]
async fn when_no_turns_are_timed_for_a_while_the_next_start_opens_the_share() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let running = start(&site).await;
    let waiter = waiting_start(&site).await;
    assert_eq!(site.now().limit, Some(1));
    // The students stop turning pages: nobody is seen slowing down.
    tokio::time::advance(UNSEEN + Duration::from_secs(1)).await;
    drop(running);
    let _let_in = waiter.await.unwrap().unwrap();
    assert_eq!(site.now().limit, None);
}

#[tokio::test(start_paused = true)]
async fn a_start_that_waited_its_patience_leaves_no_place_and_no_count() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let running = start(&site).await;
    let ended = site
        .enter(YIELD_AT, Instant::now(), Duration::from_secs(5))
        .await;
    assert_eq!(ended.unwrap_err(), Ended::Timeout);
    assert_eq!(site.now().waiting, 0);
    drop(running);
    assert!(gets_in_at_once(&site).await, "the place went back");
}

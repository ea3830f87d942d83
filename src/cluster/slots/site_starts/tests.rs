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
    assert_eq!(site.now().limit, None, "nothing to compare the turns with");
    assert_eq!(site.now().running, 20);
}

#[tokio::test(start_paused = true)]
async fn turns_slowed_past_yield_at_halve_the_starts_and_recovered_turns_let_them_in_again() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    assert_eq!(site.now().calm, Some(Duration::from_millis(100)));
    let mut running = starts(&site, 4).await;
    tokio::time::advance(Duration::from_millis(1001)).await;
    // Four starts at once and the turns take twice their calm: two at once.
    a_second_of_turns(&site, 200).await;
    site.turn_took(YIELD_AT, Duration::from_millis(200));
    assert_eq!(site.now().limit, Some(2));
    assert!(!gets_in_at_once(&site).await, "four run, two allowed");
    // The first two starts to finish pay for the narrowing; the third frees a place.
    running.pop();
    running.pop();
    assert!(!gets_in_at_once(&site).await, "two run, two allowed");
    running.pop();
    assert!(gets_in_at_once(&site).await);
    // Still slow with one running: one at once, never none.
    a_second_of_turns(&site, 200).await;
    site.turn_took(YIELD_AT, Duration::from_millis(200));
    assert_eq!(site.now().limit, Some(1));
    // A start waits; the turns recover: one more place, which it takes.
    let waiter = {
        let site = site.clone();
        tokio::spawn(async move { site.enter(YIELD_AT, Instant::now(), PATIENCE).await })
    };
    while site.now().waiting == 0 {
        tokio::task::yield_now().await;
    }
    a_second_of_turns(&site, 100).await;
    site.turn_took(YIELD_AT, Duration::from_millis(100));
    assert_eq!(site.now().limit, Some(2));
    let second = waiter.await.unwrap().unwrap();
    assert!(second.waited);
    // Recovered again with nobody waiting: as wide as the nodes' gates.
    a_second_of_turns(&site, 100).await;
    site.turn_took(YIELD_AT, Duration::from_millis(100));
    assert_eq!(site.now().limit, None);
}

#[tokio::test(start_paused = true)]
async fn turns_within_the_margin_hold_the_share_where_it_is() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let running = starts(&site, 4).await;
    tokio::time::advance(Duration::from_millis(1001)).await;
    a_second_of_turns(&site, 200).await;
    site.turn_took(YIELD_AT, Duration::from_millis(140));
    assert_eq!(site.now().limit, Some(2));
    for _ in 0..5 {
        a_second_of_turns(&site, 140).await;
    }
    assert_eq!(site.now().limit, Some(2), "1.4 × calm: between the margins");
    drop(running);
}

#[tokio::test(start_paused = true)]
async fn a_start_that_waited_a_quarter_of_its_patience_opens_a_place_whatever_the_turns_say() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let running = start(&site).await;
    tokio::time::advance(Duration::from_millis(1001)).await;
    a_second_of_turns(&site, 400).await;
    site.turn_took(YIELD_AT, Duration::from_millis(400));
    assert_eq!(site.now().limit, Some(1));
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
    drop(running);
    let waited = waiter.await.unwrap().unwrap();
    assert!(waited.waited);
    // Having waited long, it opens one more place at the next second's close,
    // though the turns are still slow.
    a_second_of_turns(&site, 400).await;
    site.turn_took(YIELD_AT, Duration::from_millis(400));
    assert_eq!(site.now().limit, Some(2));
    drop(waited);
}

#[tokio::test(start_paused = true)]
async fn a_halving_not_yet_felt_is_not_halved_again_and_a_widening_first_pays_what_is_owed() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let mut running = starts(&site, 4).await;
    tokio::time::advance(Duration::from_millis(1001)).await;
    a_second_of_turns(&site, 200).await;
    site.turn_took(YIELD_AT, Duration::from_millis(200));
    assert_eq!(site.now().limit, Some(2));
    // Four still run, two allowed: the turns cannot have felt the halving yet.
    a_second_of_turns(&site, 200).await;
    site.turn_took(YIELD_AT, Duration::from_millis(200));
    assert_eq!(site.now().limit, Some(2), "held until the halving is felt");
    // A start waits; the turns recover: one more place, taken from what the
    // running starts owe, so nobody new gets in yet.
    let waiter = {
        let site = site.clone();
        tokio::spawn(async move { site.enter(YIELD_AT, Instant::now(), PATIENCE).await })
    };
    while site.now().waiting == 0 {
        tokio::task::yield_now().await;
    }
    a_second_of_turns(&site, 100).await;
    site.turn_took(YIELD_AT, Duration::from_millis(100));
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
    tokio::time::advance(Duration::from_millis(1001)).await;
    a_second_of_turns(&site, 400).await;
    site.turn_took(YIELD_AT, Duration::from_millis(400));
    assert_eq!(site.now().limit, Some(1));
    let waiter = {
        let site = site.clone();
        tokio::spawn(async move { site.enter(YIELD_AT, Instant::now(), PATIENCE).await })
    };
    while site.now().waiting == 0 {
        tokio::task::yield_now().await;
    }
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
    tokio::time::advance(Duration::from_millis(1001)).await;
    a_second_of_turns(&site, 400).await;
    site.turn_took(YIELD_AT, Duration::from_millis(400));
    assert_eq!(site.now().limit, Some(1));
    let ended = site
        .enter(YIELD_AT, Instant::now(), Duration::from_secs(5))
        .await;
    assert_eq!(ended.unwrap_err(), Ended::Timeout);
    assert_eq!(site.now().waiting, 0);
    drop(running);
    assert!(gets_in_at_once(&site).await, "the place went back");
}

#[tokio::test(start_paused = true)]
async fn starts_waiting_go_in_the_order_they_came() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let first = start(&site).await;
    tokio::time::advance(Duration::from_millis(1001)).await;
    a_second_of_turns(&site, 300).await;
    site.turn_took(YIELD_AT, Duration::from_millis(300));
    assert_eq!(site.now().limit, Some(1));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for name in ["second", "third", "fourth"] {
        let (starts, tx) = (site.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let permit = starts
                .enter(YIELD_AT, Instant::now(), PATIENCE)
                .await
                .unwrap();
            tx.send(name).unwrap();
            drop(permit);
        }));
        let before = site.now().waiting;
        while site.now().waiting == before {
            tokio::task::yield_now().await;
        }
    }
    drop(first);
    for task in tasks {
        task.await.unwrap();
    }
    let order: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert_eq!(order, ["second", "third", "fourth"]);
}

#[tokio::test(start_paused = true)]
async fn turned_off_it_holds_no_start_and_forgets_a_narrowing() {
    let site = Arc::new(SiteStarts::default());
    calm_of_100ms(&site).await;
    let _running = start(&site).await;
    tokio::time::advance(Duration::from_millis(1001)).await;
    a_second_of_turns(&site, 300).await;
    site.turn_took(YIELD_AT, Duration::from_millis(300));
    assert_eq!(site.now().limit, Some(1));
    let off = site
        .enter(0.0, Instant::now(), Duration::ZERO)
        .await
        .unwrap();
    assert!(!off.waited);
    assert_eq!(site.now().limit, None);
    assert!(gets_in_at_once(&site).await);
}

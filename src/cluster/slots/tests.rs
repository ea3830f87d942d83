//! The line's rules: the cap, the order (class, arrival, aging) and each ending.

use super::*;

const AGING: Duration = Duration::from_secs(10);
const FOREVER: Duration = Duration::from_secs(3600);

fn node(cap: usize, max_waiting: usize) -> Arc<Slots> {
    Arc::new(Slots::new(cap, Arc::new(Crowd::new(max_waiting))))
}

/// A node's own pool and its low-priority pool, a slot each, whose lines share one
/// bound of `max_waiting`.
fn two_pools(max_waiting: usize) -> (Arc<Crowd>, Arc<Slots>, Arc<Slots>) {
    let crowd = Arc::new(Crowd::new(max_waiting));
    let own = Arc::new(Slots::new(1, crowd.clone()));
    let low = Arc::new(Slots::new(1, crowd.clone()));
    (crowd, own, low)
}

/// The crowd of these tests, whose every waiter stands in the newcomers' line.
fn load(crowd: &Crowd) -> Load {
    crowd.load(crowd.waiting())
}

fn ask(class: Class, arrived: Instant) -> Ask {
    Ask {
        class,
        arrived,
        aging: AGING,
        patience: FOREVER,
    }
}

/// Starts waiting for a slot on `slots`; the task reports its name when it gets one
/// and then holds the slot until told to let go.
fn waiter(
    slots: &Arc<Slots>,
    ask: Ask,
    name: &'static str,
    served: &tokio::sync::mpsc::UnboundedSender<&'static str>,
) -> tokio::task::JoinHandle<Result<(), Ended>> {
    let (slots, served) = (slots.clone(), served.clone());
    tokio::spawn(async move {
        let permit = slots.acquire(ask).await?;
        served.send(name).unwrap();
        drop(permit);
        Ok(())
    })
}

/// The names the waiters reported, in the order they got their slots, once every
/// one of `tasks` has had its slot.
async fn served_in_order(
    tasks: impl IntoIterator<Item = tokio::task::JoinHandle<Result<(), Ended>>>,
    order: &mut tokio::sync::mpsc::UnboundedReceiver<&'static str>,
) -> Vec<&'static str> {
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    std::iter::from_fn(|| order.try_recv().ok()).collect()
}

/// Lets the spawned waiters run until each has joined the line or finished.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn under_the_cap_a_request_goes_at_once_and_the_next_waits_for_a_freed_slot() {
    let slots = node(2, 100);
    let now = Instant::now();
    let first = slots.acquire(ask(Class::Newcomer, now)).await.unwrap();
    let _second = slots.acquire(ask(Class::Newcomer, now)).await.unwrap();
    assert_eq!(slots.now().active, 2);
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let third = waiter(&slots, ask(Class::Newcomer, now), "third", &served);
    settle().await;
    assert_eq!(slots.queued(), 1, "over the cap it waits in the gateway");
    assert!(order.try_recv().is_err());
    drop(first);
    assert_eq!(order.recv().await, Some("third"));
    third.await.unwrap().unwrap();
    assert_eq!(slots.now().active, 1, "third gave its slot back");
}

#[tokio::test]
async fn a_slot_free_at_once_is_taken_without_waiting_and_none_past_the_cap() {
    let slots = node(1, 100);
    let held = slots.try_acquire().expect("an idle node has a free slot");
    assert_eq!(slots.now().active, 1);
    assert!(slots.try_acquire().is_none(), "at its cap");
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let waiting = waiter(
        &slots,
        ask(Class::LoggedIn, Instant::now()),
        "waiting",
        &served,
    );
    settle().await;
    drop(held);
    assert_eq!(
        order.recv().await,
        Some("waiting"),
        "the freed slot went to the waiter"
    );
    waiting.await.unwrap().unwrap();
    let again = slots
        .try_acquire()
        .expect("free again once the waiter let go");
    drop(again);
    assert_eq!(
        slots.now().active,
        0,
        "a slot taken at once is given back on drop"
    );
    assert!(
        node(0, 100).try_acquire().is_some(),
        "a node without a cap never refuses"
    );
}

#[tokio::test]
async fn a_freed_slot_goes_to_work_in_progress_then_students_then_anonymous_then_newcomers() {
    let slots = node(1, 100);
    let t0 = Instant::now();
    let busy = slots.acquire(ask(Class::LoggedIn, t0)).await.unwrap();
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let ms = Duration::from_millis;
    let tasks = [
        waiter(&slots, ask(Class::Newcomer, t0), "newcomer", &served),
        waiter(
            &slots,
            ask(Class::Anonymous, t0 + ms(1)),
            "anonymous",
            &served,
        ),
        waiter(
            &slots,
            ask(Class::LoggedIn, t0 + ms(3)),
            "student 2",
            &served,
        ),
        waiter(
            &slots,
            ask(Class::LoggedIn, t0 + ms(2)),
            "student 1",
            &served,
        ),
        waiter(
            &slots,
            ask(Class::Working, t0 + ms(5)),
            "page turn",
            &served,
        ),
        waiter(
            &slots,
            ask(Class::Newcomer, t0 + ms(4)),
            "newcomer 2",
            &served,
        ),
    ];
    settle().await;
    assert_eq!(slots.now().queued, [1, 2, 1, 2]);
    drop(busy);
    let got = served_in_order(tasks, &mut order).await;
    assert_eq!(
        got,
        [
            "page turn",
            "student 1",
            "student 2",
            "anonymous",
            "newcomer",
            "newcomer 2"
        ]
    );
}

#[tokio::test]
async fn however_long_the_crowd_waited_a_student_goes_first() {
    let slots = node(1, 100);
    let t0 = Instant::now();
    let busy = slots.acquire(ask(Class::LoggedIn, t0)).await.unwrap();
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let s = Duration::from_secs;
    let tasks = [
        waiter(&slots, ask(Class::Newcomer, t0), "newcomer", &served),
        waiter(&slots, ask(Class::Anonymous, t0), "guest", &served),
        // Ten agings later: still ahead of the crowd.
        waiter(
            &slots,
            ask(Class::LoggedIn, t0 + s(100)),
            "late student",
            &served,
        ),
    ];
    settle().await;
    drop(busy);
    let got = served_in_order(tasks, &mut order).await;
    assert_eq!(got, ["late student", "guest", "newcomer"]);
}

#[tokio::test]
async fn within_a_tier_the_second_class_waits_at_most_one_aging_behind_later_arrivals() {
    let slots = node(1, 100);
    let t0 = Instant::now();
    let busy = slots.acquire(ask(Class::LoggedIn, t0)).await.unwrap();
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let s = Duration::from_secs;
    let tasks = [
        waiter(&slots, ask(Class::LoggedIn, t0), "course page", &served),
        // Within the page's handicap (one aging): ahead of it.
        waiter(
            &slots,
            ask(Class::Working, t0 + s(9)),
            "early turn",
            &served,
        ),
        // Past it: behind, however many more come.
        waiter(
            &slots,
            ask(Class::Working, t0 + s(11)),
            "late turn",
            &served,
        ),
        waiter(&slots, ask(Class::Newcomer, t0), "newcomer", &served),
        waiter(
            &slots,
            ask(Class::Anonymous, t0 + s(9)),
            "early guest",
            &served,
        ),
        waiter(
            &slots,
            ask(Class::Anonymous, t0 + s(11)),
            "late guest",
            &served,
        ),
    ];
    settle().await;
    drop(busy);
    let got = served_in_order(tasks, &mut order).await;
    assert_eq!(
        got,
        [
            "early turn",
            "course page",
            "late turn",
            "early guest",
            "newcomer",
            "late guest"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_that_waited_its_patience_ends_and_leaves_no_place_behind() {
    let slots = node(1, 100);
    let now = Instant::now();
    let busy = slots.acquire(ask(Class::LoggedIn, now)).await.unwrap();
    let patient = Ask {
        patience: Duration::from_secs(30),
        ..ask(Class::Newcomer, now)
    };
    let started = Instant::now();
    assert_eq!(slots.acquire(patient).await.unwrap_err(), Ended::Timeout);
    assert_eq!(started.elapsed(), Duration::from_secs(30), "not before");
    assert_eq!((slots.queued(), slots.crowd.waiting()), (0, 0));
    drop(busy);
    assert_eq!(
        slots.now().active,
        0,
        "the freed slot found nobody and is free"
    );
}

#[tokio::test]
async fn a_full_line_turns_away_a_newcomer_but_a_student_takes_a_newcomers_place() {
    let slots = node(1, 2);
    let t0 = Instant::now();
    let busy = slots.acquire(ask(Class::LoggedIn, t0)).await.unwrap();
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let guest = waiter(&slots, ask(Class::Anonymous, t0), "guest", &served);
    let newcomer = waiter(&slots, ask(Class::Newcomer, t0), "newcomer", &served);
    settle().await;
    assert_eq!(load(&slots.crowd).newcomers_waiting, 1);
    let late = slots.acquire(ask(Class::Newcomer, t0)).await;
    assert_eq!(
        late.unwrap_err(),
        Ended::Full,
        "nobody below it to displace"
    );
    let student = waiter(&slots, ask(Class::LoggedIn, t0), "student", &served);
    settle().await;
    assert_eq!(newcomer.await.unwrap().unwrap_err(), Ended::Full);
    assert_eq!(slots.now().queued, [0, 1, 1, 0]);
    assert_eq!(
        load(&slots.crowd).newcomers_waiting,
        0,
        "its place passed on"
    );
    drop(busy);
    let got = served_in_order([student, guest], &mut order).await;
    assert_eq!(got, ["student", "guest"]);
    assert_eq!((slots.crowd.waiting(), slots.now().active), (0, 0));
}

/// A node's two PHP pools have a line each and share the gateway's bound: a
/// student's work in progress that finds it full while a newcomer waits in the
/// other pool's line has the newcomer give way.
#[tokio::test]
async fn a_full_line_gives_a_student_the_place_of_a_newcomer_waiting_at_the_other_pool() {
    let (crowd, own, low) = two_pools(1);
    let t0 = Instant::now();
    let (_busy_own, _busy_low) = (
        own.acquire(ask(Class::Working, t0)).await.unwrap(),
        low.acquire(ask(Class::LoggedIn, t0)).await.unwrap(),
    );
    let (served, _order) = tokio::sync::mpsc::unbounded_channel();
    let newcomer = waiter(&low, ask(Class::Newcomer, t0), "newcomer", &served);
    settle().await;
    let turn = own.acquire(ask(Class::Working, t0)).await;
    assert_eq!(
        turn.unwrap_err(),
        Ended::Full,
        "its own line has nobody below it"
    );
    assert!(
        !low.give_way(Class::Newcomer),
        "nobody ranks below a newcomer"
    );
    assert!(low.give_way(Class::Working));
    assert_eq!(newcomer.await.unwrap().unwrap_err(), Ended::Full);
    assert_eq!((low.now().queued, crowd.waiting()), ([0; 4], 0));
    let student = waiter(&own, ask(Class::Working, t0), "turn", &served);
    settle().await;
    assert_eq!(
        own.now().queued,
        [1, 0, 0, 0],
        "the student waits in its place"
    );
    drop(student);
}

/// The slots a node's own pool frees while newcomers wait at its low-priority one
/// say nothing of the newcomers' pace.
#[tokio::test]
async fn a_pool_that_does_not_pace_the_crowd_frees_its_slots_uncounted() {
    let (crowd, own, low) = two_pools(10);
    own.set_paces(false);
    let t0 = Instant::now();
    for _ in 0..3 {
        drop(own.acquire(ask(Class::Working, t0)).await.unwrap());
    }
    drop(low.acquire(ask(Class::Newcomer, t0)).await.unwrap());
    assert_eq!(
        crowd.freed.load(Ordering::Relaxed),
        1,
        "only the newcomers' pool's"
    );
}

#[tokio::test]
async fn a_waiter_that_leaves_gives_up_its_place_and_never_keeps_a_slot() {
    let slots = node(1, 100);
    let now = Instant::now();
    let busy = slots.acquire(ask(Class::LoggedIn, now)).await.unwrap();
    let (served, _order) = tokio::sync::mpsc::unbounded_channel();
    let gone = waiter(&slots, ask(Class::LoggedIn, now), "gone", &served);
    settle().await;
    gone.abort();
    let _ = gone.await;
    assert_eq!((slots.queued(), slots.crowd.waiting()), (0, 0));
    drop(busy);
    assert_eq!(slots.now().active, 0);
    // A slot handed over in the instant its waiter leaves comes back too.
    let busy = slots.acquire(ask(Class::LoggedIn, now)).await.unwrap();
    let mut leaving = Box::pin(slots.acquire(ask(Class::LoggedIn, now)));
    use futures_util::FutureExt;
    assert!(leaving.as_mut().now_or_never().is_none(), "it waits");
    drop(busy);
    drop(leaving);
    assert_eq!(
        slots.now().active,
        0,
        "the slot given to a leaver is free again"
    );
}

#[tokio::test]
async fn a_reload_that_raises_the_cap_or_removes_it_lets_the_waiters_in() {
    for new_cap in [4, 0] {
        let slots = node(1, 100);
        let now = Instant::now();
        let busy = slots.acquire(ask(Class::LoggedIn, now)).await.unwrap();
        let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
        let tasks: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|name| waiter(&slots, ask(Class::Newcomer, now), name, &served))
            .collect();
        settle().await;
        assert_eq!(slots.queued(), 3);
        slots.set_cap(new_cap);
        let got = served_in_order(tasks, &mut order).await;
        assert_eq!(
            got,
            ["a", "b", "c"],
            "in while the first slot is still busy"
        );
        drop(busy);
        assert_eq!((slots.queued(), slots.now().active), (0, 0));
    }
}

#[tokio::test]
async fn a_slot_kept_by_a_node_body_is_freed_by_its_release() {
    let slots = node(1, 100);
    let held = (slots.acquire(ask(Class::LoggedIn, Instant::now())).await)
        .unwrap()
        .into_held()
        .expect("a capped node's slot");
    assert_eq!(slots.now().active, 1, "handing it over keeps it");
    held.release();
    assert_eq!(slots.now().active, 0);
    let uncapped = node(0, 100);
    let permit = uncapped.acquire(ask(Class::LoggedIn, Instant::now())).await;
    assert!(permit.unwrap().into_held().is_none(), "nothing to hold");
}

#[test]
fn the_expected_wait_is_the_work_ahead_over_the_pace_slots_free_at() {
    let load = |waiting, newcomers_waiting, pace| Load {
        waiting,
        newcomers_waiting,
        per_newcomer: 4.0,
        pace,
        newcomers_waited: None,
    };
    assert_eq!(
        load(0, 0, 0.0).expected_wait(),
        Some(Duration::ZERO),
        "nobody waits"
    );
    assert_eq!(
        load(2, 0, 0.0).expected_wait(),
        None,
        "waiters and no pace: stuck"
    );
    assert_eq!(
        load(2, 0, 4.0).expected_wait(),
        Some(Duration::from_millis(500))
    );
    // Each newcomer waiting brings three more requests of its login.
    assert_eq!(
        load(10, 10, 8.0).expected_wait(),
        Some(Duration::from_secs(5)),
        "a crowd that has just arrived is a long line already"
    );
}

#[tokio::test(start_paused = true)]
async fn the_crowd_shows_how_many_requests_a_newcomer_makes_before_logging_in() {
    let crowd = Crowd::new(100);
    assert_eq!(load(&crowd).per_newcomer, LOGIN_REQUESTS, "before anything");
    for _ in 0..10 {
        crowd.served(Class::Newcomer);
        for _ in 0..5 {
            crowd.served(Class::Anonymous);
        }
        crowd.served(Class::Working);
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(load(&crowd).per_newcomer, (4.0 + 6.0) / 2.0, "smoothed");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(load(&crowd).per_newcomer, 5.0, "no newcomer: kept");
}

#[tokio::test(start_paused = true)]
async fn the_pace_is_the_slots_freed_per_second() {
    let slots = node(1, 100);
    for _ in 0..10 {
        drop(
            slots
                .acquire(ask(Class::LoggedIn, Instant::now()))
                .await
                .unwrap(),
        );
    }
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        load(&slots.crowd),
        Load {
            waiting: 0,
            newcomers_waiting: 0,
            per_newcomer: LOGIN_REQUESTS,
            pace: 5.0,
            newcomers_waited: None,
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_minute_with_nothing_freed_while_a_request_waits_is_no_pace_and_no_panic() {
    let slots = node(1, 100);
    for _ in 0..10 {
        drop(slots.acquire(ask(Class::LoggedIn, Instant::now())).await);
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(load(&slots.crowd).pace, 10.0);
    // The node hangs on one request, and a student's POST waits behind it.
    let _stuck = slots.acquire(ask(Class::LoggedIn, Instant::now())).await;
    let waiting = slots.clone();
    let _waiter = tokio::spawn(async move {
        let _ = waiting.acquire(ask(Class::Working, Instant::now())).await;
    });
    // Read every second, as `/metrics` and each newcomer's page view read it.
    for _ in 0..90 {
        tokio::time::advance(Duration::from_secs(1)).await;
        let load = load(&slots.crowd);
        assert_eq!(load.waiting, 1);
        let _ = load.expected_wait();
    }
    let load = load(&slots.crowd);
    assert_eq!(load.pace, 0.0, "a pace that faded below the floor is none");
    assert_eq!(load.expected_wait(), None, "stuck, not a wait of 10^20 s");
    let faded = Load {
        pace: 1e-30,
        ..load
    };
    assert_eq!(faded.expected_wait(), None, "no Duration holds it");
}

#[tokio::test(start_paused = true)]
async fn a_quiet_morning_keeps_the_pace_so_the_first_newcomers_after_it_are_not_read_as_stuck() {
    let slots = node(1, 100);
    for _ in 0..10 {
        drop(slots.acquire(ask(Class::Newcomer, Instant::now())).await);
    }
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(load(&slots.crowd).pace, 10.0);
    // Ten minutes before the class comes, read every second: a login now and then,
    // nobody waits.
    for second in 0..600 {
        if second % 10 == 0 {
            drop(slots.acquire(ask(Class::Newcomer, Instant::now())).await);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        let _ = load(&slots.crowd);
    }
    assert_eq!(load(&slots.crowd).pace, 10.0, "quiet is not slow");
    // The class arrives: the first newcomer takes the slot, the next one waits.
    let _first = slots.acquire(ask(Class::Newcomer, Instant::now())).await;
    let waiting = slots.clone();
    let _second = tokio::spawn(async move {
        let _ = waiting.acquire(ask(Class::Newcomer, Instant::now())).await;
    });
    settle().await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let now = load(&slots.crowd);
    assert_eq!((now.waiting, now.pace), (1, 10.0));
    assert!(
        now.expected_wait().is_some(),
        "reckoned at the pace before the quiet spell, not a stuck node: {now:?}"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        load(&slots.crowd).pace,
        5.0,
        "a second of waiting with nothing freed lowers it"
    );
}

#[test]
fn what_newcomers_just_waited_counts_when_it_is_longer_than_the_reckoning() {
    let crowd = Crowd::new(100);
    crowd.newcomer_waited(Duration::from_secs(6));
    let mut now = load(&crowd);
    assert_eq!(now.newcomers_waited, Some(Duration::from_secs(6)));
    (now.waiting, now.pace) = (2, 4.0);
    assert_eq!(
        now.expected_wait(),
        Some(Duration::from_secs(6)),
        "seen beats reckoned"
    );
    now.waiting = 100;
    assert_eq!(now.expected_wait(), Some(Duration::from_secs(25)));
    now.waiting = 0;
    assert_eq!(
        now.expected_wait(),
        Some(Duration::ZERO),
        "nobody waits now"
    );
    crowd.newcomer_waited(Duration::from_secs(2));
    assert_eq!(
        load(&crowd).newcomers_waited,
        Some(Duration::from_secs(4)),
        "smoothed"
    );
}

//! The dashboard page itself: a card per upstream (and with `[offload]` one for the
//! file export, written by `export`), the waiting-room panel (with a
//! `[surge]` cap, written by `surge_panel`), the asset-cache panel (unless it is
//! off, written by `cache_panel`), the last hour's charts (written by
//! `history_panel`), the Gateways panel (with a shared store, written
//! by `gateways_panel`), the find box and the session table, written from figures
//! `dashboard` gathered.
//!
//! Why every action is a plain `<form method="post">`: the page must work with
//! JavaScript off. Each form carries the login's CSRF token; the answer is a
//! redirect back here with a one-line flash (Post/Redirect/Get), so a reload never
//! repeats an action.

use std::fmt::Write as _;

use super::cache::CacheView;
use super::cache_panel;
use super::export::{self, ExportNow};
use super::gateways_panel::{self, Panel};
use super::html::{duration, figure, html, markup, tenths, Markup, Raw};
use super::rates::Rate;
use super::surge::SurgeNow;
use super::surge_panel;
use crate::cluster::health::LastProbe;
use crate::cluster::slots::SlotsNow;
use crate::cluster::slow_start::Share;
use crate::config::NodeState;
use crate::sessions::affinity::SessionState;

/// One upstream's card.
pub(super) struct Card {
    pub(super) name: String,
    /// A PHP node (sessions, weight, buttons), not the data server.
    pub(super) node: bool,
    pub(super) url: String,
    pub(super) weight: u32,
    pub(super) state: NodeState,
    pub(super) up: bool,
    /// Unix seconds of the last up/down change.
    pub(super) since: u64,
    pub(super) maintenance: bool,
    pub(super) probe: Option<LastProbe>,
    pub(super) live: u64,
    pub(super) logged_in: u64,
    pub(super) rate: Option<Rate>,
    pub(super) losses: u64,
    /// Its slots, on a PHP node while some node has a cap (`None`: not shown).
    pub(super) slots: Option<SlotsNow>,
    /// Its share of new sessions while it warms up (`[session] slow_start`).
    pub(super) warming: Option<Share>,
}

/// One row of the session table.
pub(super) struct Row {
    pub(super) hash: String,
    pub(super) node: String,
    pub(super) state: SessionState,
    pub(super) age: u64,
    pub(super) idle: u64,
    pub(super) requests: u32,
}

/// The session a find led to.
pub(super) struct Found {
    pub(super) row: Row,
    /// The gateway that bound it, as the shared store says (`None` without one,
    /// or when Redis did not answer).
    pub(super) bound_by: Option<String>,
}

/// The table's filters as the form holds them (already validated).
#[derive(Default)]
pub(super) struct Filters {
    pub(super) node: String,
    pub(super) state: String,
    pub(super) prefix: String,
}

/// Everything the page shows.
pub(super) struct View {
    pub(super) now: u64,
    pub(super) csrf: String,
    pub(super) can_log_out: bool,
    pub(super) flash: Option<String>,
    pub(super) cards: Vec<Card>,
    /// The data server's file export (`None` without `[offload]`).
    pub(super) export: Option<ExportNow>,
    pub(super) totals: (u64, u64),
    /// The line and the waiting room (`None` while no node has a cap).
    pub(super) surge: Option<SurgeNow>,
    /// The asset cache (`None` while `[cache] enabled = false`).
    pub(super) cache: Option<CacheView>,
    /// The rate limits (`None` while none is on).
    pub(super) limits: Option<Vec<super::limits_panel::LimitNow>>,
    /// The last hour's charts, written by `history_panel`.
    pub(super) history: Markup,
    /// Every live gateway (`None` without a shared store).
    pub(super) gateways: Option<Panel>,
    pub(super) found: Option<Result<Found, String>>,
    pub(super) filters: Filters,
    pub(super) rows: Vec<Row>,
    /// The cursor of the next page, when this one is full.
    pub(super) next: Option<String>,
    pub(super) paged: bool,
}

/// The page's `<body>` content.
pub(super) fn body(view: &View) -> Markup {
    let mut out = Markup::with_capacity(16 * 1024);
    header(&mut out, view);
    html!(
        out,
        "<main><section class=\"cards\" aria-label=\"Upstreams\">"
    );
    for card in &view.cards {
        write_card(&mut out, card, view);
    }
    if let Some(now) = &view.export {
        export::card(&mut out, now, view.now);
    }
    html!(out, "</section>");
    if let Some(surge) = &view.surge {
        surge_panel::write(&mut out, surge);
    }
    if let Some(limits) = &view.limits {
        super::limits_panel::write(&mut out, limits);
    }
    if let Some(cache) = &view.cache {
        cache_panel::write(&mut out, cache, &view.csrf);
    }
    html!(out, view.history);
    if let Some(panel) = &view.gateways {
        gateways_panel::write(&mut out, panel, view.now);
    }
    find(&mut out, view);
    sessions(&mut out, view);
    html!(
        out,
        "</main><footer>Refreshes every 5 s while no field has the focus. Sessions: live \
         entries in the gateway's table (learned from each node's Set-Cookie). Requests/s \
         and errors: response heads from the node over the window shown. Lost: logged-in \
         sessions the node replaced outside login and logout, since start.</footer>"
    );
    out
}

fn header(out: &mut Markup, view: &View) {
    let (live, logged_in) = view.totals;
    let anonymous = live.saturating_sub(logged_in);
    html!(
        out,
        "<header><h1>moodle-gateway</h1><p class=\"totals\" id=\"totals\">",
        live,
        " live sessions · ",
        logged_in,
        " logged in · ",
        anonymous,
        " anonymous</p>"
    );
    if view.can_log_out {
        html!(
            out,
            "<form class=\"inline\" method=\"post\" action=\"/logout\">",
            csrf_field(&view.csrf),
            "<button type=\"submit\">Log out</button></form>"
        );
    }
    html!(out, "</header>");
    if let Some(flash) = &view.flash {
        html!(
            out,
            "<p class=\"flash\" id=\"flash\" role=\"status\">",
            flash,
            "</p>"
        );
    }
}

/// The hidden field that carries the login's CSRF token in every form.
pub(super) fn csrf_field(csrf: &str) -> Markup {
    markup!("<input type=\"hidden\" name=\"csrf\" value=\"", csrf, "\">")
}

fn write_card(out: &mut Markup, card: &Card, view: &View) {
    let health = if card.up { "up" } else { "down" };
    let state = card.state.as_str();
    let name = &card.name;
    html!(
        out,
        "<article class=\"card is-",
        health,
        " is-",
        state,
        "\" id=\"node-",
        name,
        "\"><h2>",
        name,
        "<span class=\"badge health ",
        health,
        "\">",
        health,
        "</span>"
    );
    if card.node {
        html!(
            out,
            "<span class=\"badge state state-",
            state,
            "\">",
            state,
            "</span>"
        );
    } else {
        html!(out, "<span class=\"badge\">data server</span>");
    }
    if card.maintenance {
        html!(out, "<span class=\"badge\">Moodle maintenance</span>");
    }
    let drained = card.node && card.state != NodeState::Active && card.logged_in == 0;
    if drained {
        html!(
            out,
            "<span class=\"badge\" title=\"no logged-in student left\">drained</span>"
        );
    }
    if let Some(share) = card.warming {
        html!(
            out,
            "<span class=\"badge\" title=\"slow start: its share of new sessions grows while \
             its caches warm\">warming ",
            share / 10,
            " %</span>"
        );
    }
    let since = duration(view.now.saturating_sub(card.since));
    html!(
        out,
        "</h2><p class=\"why\">",
        card.url,
        " · ",
        health,
        " for ",
        since,
        "<br>"
    );
    match &card.probe {
        Some(probe) => {
            let ago = duration(view.now.saturating_sub(probe.at));
            html!(out, "Last probe ", ago, " ago: ", probe.said);
        }
        None => html!(
            out,
            "No probe yet (the first comes one interval after start)"
        ),
    }
    html!(out, "</p><dl>");
    figures(out, card);
    html!(out, "</dl>");
    if card.node {
        buttons(out, card, &view.csrf);
    }
    html!(out, "</article>");
}

fn figures(out: &mut Markup, card: &Card) {
    if card.node {
        let anonymous = card.live.saturating_sub(card.logged_in);
        figure(out, "Live sessions", "live", &card.live);
        figure(out, "Logged in", "logged-in", &card.logged_in);
        figure(out, "Anonymous", "anonymous", &anonymous);
        figure(out, "Weight", "weight", &card.weight);
    }
    for (label, key, value) in card.slots.iter().flat_map(surge_panel::card_figures) {
        figure(out, label, key, &value);
    }
    let (per_second, errors) = match card.rate {
        Some(rate) => (
            markup!(
                tenths(rate.per_second),
                " <small>over ",
                duration(rate.window.as_secs()),
                "</small>"
            ),
            rate.errors
                .map_or(markup!("none asked"), |e| markup!(tenths(e * 100.0), " %")),
        ),
        None => (markup!("measuring…"), markup!("measuring…")),
    };
    figure(out, "Requests/s", "rate", &per_second);
    figure(out, "Errors (5xx)", "errors", &errors);
    if card.node {
        figure(out, "Sessions lost", "losses", &card.losses);
    }
}

/// The two actions that make sense from the node's state: drain and disable an
/// active node, undrain or disable a draining one, enable or drain a disabled one.
fn buttons(out: &mut Markup, card: &Card, csrf: &str) {
    let actions: [(&str, &str); 2] = match card.state {
        NodeState::Active => [("drain", "Drain"), ("disable", "Disable")],
        NodeState::Draining => [("undrain", "Undrain"), ("disable", "Disable")],
        NodeState::Disabled => [("enable", "Enable"), ("drain", "Drain")],
    };
    html!(out, "<div class=\"actions\">");
    for (action, label) in actions {
        html!(
            out,
            "<form method=\"post\" action=\"/ui/nodes/",
            card.name,
            "/",
            action,
            "\">",
            csrf_field(csrf)
        );
        // Disabling moves every logged-in student at once: a box to tick first.
        if action == "disable" && card.logged_in > 0 {
            html!(
                out,
                "<label class=\"confirm\"><input type=\"checkbox\" name=\"confirm\" \
                 value=\"yes\" required> moves ",
                card.logged_in,
                " logged-in</label>"
            );
        }
        html!(
            out,
            "<button type=\"submit\" data-action=\"",
            action,
            "\">",
            label,
            "</button></form>"
        );
    }
    html!(out, "</div>");
}

fn find(out: &mut Markup, view: &View) {
    html!(
        out,
        "<section id=\"find\"><h2>Find a student's session</h2>\
         <form class=\"search\" method=\"post\" action=\"/ui/find\">",
        csrf_field(&view.csrf),
        "<label>Session id (the student's MoodleSession cookie; never shown or kept)\
         <input name=\"session\" autocomplete=\"off\" spellcheck=\"false\" required></label>\
         <button type=\"submit\">Find</button></form>"
    );
    match &view.found {
        Some(Ok(found)) => found_line(out, found),
        Some(Err(why)) => html!(out, "<p class=\"flash\" id=\"found\">", why, "</p>"),
        None => {}
    }
    html!(out, "</section>");
}

fn found_line(out: &mut Markup, found: &Found) {
    let row = &found.row;
    html!(
        out,
        "<p class=\"found\" id=\"found\">Session <code>",
        row.hash,
        "</code> is on <b data-found=\"node\">",
        row.node,
        "</b>, ",
        state_label(row.state),
        ", ",
        duration(row.age),
        " old, idle ",
        duration(row.idle),
        ", ",
        row.requests,
        " requests"
    );
    if let Some(by) = &found.bound_by {
        html!(out, ", bound by <b data-found=\"bound-by\">", by, "</b>");
    }
    html!(out, ".</p>");
}

fn state_label(state: SessionState) -> &'static str {
    match state {
        SessionState::LoggedIn => "logged in",
        SessionState::Anonymous => "anonymous",
    }
}

fn sessions(out: &mut Markup, view: &View) {
    let f = &view.filters;
    html!(
        out,
        "<section id=\"sessions\"><h2>Sessions</h2>\
         <form class=\"search\" method=\"get\" action=\"/\"><label>Node<select name=\"node\">"
    );
    option(out, "", "every node", &f.node);
    for card in view.cards.iter().filter(|c| c.node) {
        option(out, &card.name, &card.name, &f.node);
    }
    html!(out, "</select></label><label>State<select name=\"state\">");
    option(out, "", "any", &f.state);
    option(out, "logged-in", "logged in", &f.state);
    option(out, "anonymous", "anonymous", &f.state);
    html!(
        out,
        "</select></label><label>Hash starts with<input name=\"q\" value=\"",
        f.prefix,
        "\" maxlength=\"16\" autocomplete=\"off\" spellcheck=\"false\"></label>\
         <button type=\"submit\">Show</button></form>"
    );
    table(out, &view.rows);
    html!(out, "<p>");
    if view.paged {
        html!(out, "<a href=\"", link(f, None), "\">First page</a> ");
    }
    if let Some(next) = &view.next {
        html!(out, "<a href=\"", link(f, Some(next)), "\">Next page</a>");
    }
    html!(out, "</p></section>");
}

fn option(out: &mut Markup, value: &str, label: &str, chosen: &str) {
    let selected = if value == chosen { " selected" } else { "" };
    html!(
        out,
        "<option value=\"",
        value,
        "\"",
        Raw(selected),
        ">",
        label,
        "</option>"
    );
}

fn table(out: &mut Markup, rows: &[Row]) {
    if rows.is_empty() {
        html!(out, "<p>No session matches.</p>");
        return;
    }
    html!(
        out,
        "<div class=\"scroll\"><table><thead><tr><th>Session (keyed hash)</th><th>Node</th>\
         <th>State</th><th>Age</th><th>Idle</th><th>Requests</th></tr></thead><tbody>"
    );
    for row in rows {
        html!(
            out,
            "<tr><td><code>",
            row.hash,
            "</code></td><td>",
            row.node,
            "</td><td>",
            state_label(row.state),
            "</td><td>",
            duration(row.age),
            "</td><td>",
            duration(row.idle),
            "</td><td>",
            row.requests,
            "</td></tr>"
        );
    }
    html!(out, "</tbody></table></div>");
}

/// `/?node=…&state=…&q=…&after=…#sessions`, values percent-encoded. A URL, not
/// markup: it is escaped where a page writes it into an `href`.
fn link(filters: &Filters, after: Option<&str>) -> String {
    let encode = |v: &str| {
        percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let mut url = format!(
        "/?node={}&state={}&q={}",
        encode(&filters.node),
        encode(&filters.state),
        encode(&filters.prefix)
    );
    if let Some(after) = after {
        let _ = write!(url, "&after={}", encode(after));
    }
    url.push_str("#sessions");
    url
}

#[cfg(test)]
mod tests {
    use super::gateways_panel::Peer;
    use super::*;
    use crate::metrics::Degradation;

    fn card(name: &str, said: &str) -> Card {
        Card {
            name: name.into(),
            node: true,
            url: "http://10.0.0.1".into(),
            weight: 1,
            state: NodeState::Draining,
            up: false,
            since: 1_700_000_000,
            maintenance: false,
            probe: Some(LastProbe {
                at: 1_700_000_000,
                said: said.into(),
            }),
            live: 3,
            logged_in: 0,
            rate: None,
            losses: 1,
            slots: None,
            warming: None,
        }
    }

    fn view(cards: Vec<Card>) -> View {
        View {
            now: 1_700_000_100,
            csrf: "c5rf".into(),
            can_log_out: true,
            flash: Some("<i>flash</i>".into()),
            cards,
            export: None,
            totals: (3, 0),
            surge: None,
            cache: None,
            limits: None,
            history: Markup::new(),
            gateways: None,
            found: None,
            filters: Filters::default(),
            rows: Vec::new(),
            next: None,
            paged: false,
        }
    }

    #[test]
    fn a_hostile_node_name_and_probe_answer_are_shown_as_text() {
        let hostile = "web1\"><script>alert(1)</script>";
        let html = body(&view(vec![card(
            hostile,
            "answered 303 <img src=x onerror=alert(2)>",
        )]));
        assert!(!html.contains("<script>") && !html.contains("<img") && !html.contains("<i>"));
        assert!(html.contains("web1&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("answered 303 &lt;img src=x onerror=alert(2)&gt;"));
        assert!(html.contains("&lt;i&gt;flash&lt;/i&gt;"));
    }

    /// Every place the whole page writes outside text (the card's name in its id,
    /// heading, buttons' URLs and the node filter; its URL; the probe's answer; the
    /// flash; a found session; a table row; the hash filter; the Gateways panel),
    /// with quotes of both kinds, is text where it lands.
    #[test]
    fn hostile_text_anywhere_on_the_page_is_escaped_where_it_lands() {
        let hostile = "x\"'><script>alert(1)</script>";
        let e = "x&quot;&#39;&gt;&lt;script&gt;alert(1)&lt;/script&gt;";
        let mut node = card(hostile, hostile);
        node.url = hostile.into();
        let mut page = view(vec![node]);
        page.flash = Some(hostile.into());
        let row = || Row {
            hash: "00ff00ff00ff00ff".into(),
            node: hostile.into(),
            state: SessionState::Anonymous,
            age: 1,
            idle: 1,
            requests: 1,
        };
        page.found = Some(Ok(Found {
            row: row(),
            bound_by: Some(hostile.into()),
        }));
        page.rows = vec![row()];
        page.filters.prefix = hostile.into();
        let mut gateways = panel(Ok(vec![peer(hostile, &[(hostile, 1)])]), true);
        gateways.this = hostile.into();
        gateways.nodes.push(hostile.into());
        page.gateways = Some(gateways);
        let html = body(&page);
        assert!(
            !html.contains("<script") && !html.contains("\"'"),
            "{}",
            html.as_str()
        );
        for landed in [
            format!("id=\"node-{e}\"><h2>{e}<span"),
            format!("action=\"/ui/nodes/{e}/undrain\""),
            format!("<option value=\"{e}\">{e}</option>"),
            format!("<p class=\"why\">{e} · down for"),
            format!("ago: {e}</p>"),
            format!("role=\"status\">{e}</p>"),
            format!("<b data-found=\"node\">{e}</b>"),
            format!("<b data-found=\"bound-by\">{e}</b>"),
            format!("</code></td><td>{e}</td>"),
            format!("name=\"q\" value=\"{e}\""),
            format!("This gateway is <b>{e}</b>"),
            format!("<tr data-gateway=\"{e}\"><td>{e}<span"),
            format!("<th>{e}<br>"),
            format!("<td data-node=\"{e}\">1 / ?</td>"),
        ] {
            assert!(html.contains(&landed), "{landed}");
        }
    }

    #[test]
    fn a_warming_node_shows_its_share_of_new_sessions() {
        let warming = Card {
            state: NodeState::Active,
            warming: Some(350),
            ..card("web1", "answered 200 OK")
        };
        let html = body(&view(vec![warming, card("web2", "answered 200 OK")]));
        assert_eq!(html.matches(">warming 35 %<").count(), 1, "web1 only");
    }

    #[test]
    fn a_card_offers_the_actions_that_fit_its_state_each_with_the_csrf_token() {
        let html = body(&view(vec![card("web1", "answered 200 OK")]));
        assert!(html.contains("action=\"/ui/nodes/web1/undrain\""));
        assert!(html.contains("action=\"/ui/nodes/web1/disable\""));
        assert!(!html.contains("/ui/nodes/web1/drain\""));
        let forms = html.matches("<form").count();
        let tokens = html.matches("name=\"csrf\" value=\"c5rf\"").count();
        assert_eq!(
            forms - 1,
            tokens,
            "every post form but the table's GET filter"
        );
        assert!(html.contains(">drained<"), "draining with nobody logged in");
        assert!(html.contains("Last probe 1m ago: answered 200 OK"));
    }

    fn panel(gateways: Result<Vec<Peer>, String>, connected: bool) -> Panel {
        Panel {
            this: "gw-a".into(),
            connected,
            gateways,
            degradation: Degradation {
                lookups: 2,
                deals: 5,
                unwritten: 7,
                outages: 1,
            },
            nodes: vec!["web1".into(), "data".into()],
        }
    }

    fn peer(name: &str, served: &[(&str, u64)]) -> Peer {
        Peer {
            name: name.into(),
            version: Some("0.9.0".into()),
            started: Some(1_700_000_000),
            age_ms: Some(400),
            sessions: Some(3),
            in_flight: Some(1),
            served: served.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
            dealt: [("web1".to_owned(), 2)].into(),
        }
    }

    #[test]
    fn without_a_cap_the_page_shows_no_slots_and_no_waiting_room() {
        let html = body(&view(vec![card("web1", "answered 200 OK")]));
        assert!(!html.contains("data-figure=\"slots\"") && !html.contains("id=\"room\""));
    }

    #[test]
    fn with_a_cap_each_node_shows_its_slots_and_the_page_its_waiting_room() {
        let mut capped = card("web1", "answered 200 OK");
        capped.slots = Some(SlotsNow {
            cap: 4,
            active: 3,
            queued: [0, 0, 0, 0],
            passed_over: 0,
            start_share: 2,
            starts_waiting: 0,
        });
        let mut free = card("web2", "answered 200 OK");
        free.slots = Some(SlotsNow::default());
        let mut page = view(vec![capped, free]);
        page.surge = Some(SurgeNow {
            capped_nodes: 1,
            waiting: 0,
            max_waiting: 100,
            expected_wait_ms: Some(std::time::Duration::ZERO),
            room: None,
        });
        let html = body(&page);
        let web2 = html.split("id=\"node-web2\"").nth(1).unwrap();
        assert!(html.contains("data-figure=\"slots\">3 / 4</dd>"));
        assert!(web2.contains("data-figure=\"slots\">no cap</dd>"));
        assert!(!web2.contains("queued-"), "nothing waits without a cap");
        let room = html.find("id=\"room\"").unwrap();
        assert!(html.find("</section>").unwrap() < room, "after the cards");
        assert!(room < html.find("id=\"find\"").unwrap());
    }

    #[test]
    fn the_asset_cache_panel_follows_the_waiting_room_and_only_when_there_is_a_cache() {
        let mut page = view(vec![card("web1", "answered 200 OK")]);
        assert!(!body(&page).contains("id=\"cache\""), "off: no panel");
        page.cache = Some(CacheView {
            enabled: true,
            entries: 1,
            bytes: 23,
            max_bytes: 64 << 20,
            hits: 1,
            misses: 1,
            fills: 1,
            evictions: 0,
            hit_rate: Some(0.5),
        });
        page.gateways = Some(panel(Ok(vec![peer("gw-a", &[("web1", 1)])]), true));
        let html = body(&page);
        let cache = html.find("id=\"cache\"").unwrap();
        assert!(html.find("</section>").unwrap() < cache, "after the cards");
        assert!(cache < html.find("id=\"gateways\"").unwrap());
        assert!(html.contains(
            "name=\"csrf\" value=\"c5rf\"><button type=\"submit\" data-action=\"purge\">"
        ));
    }

    #[test]
    fn a_gateway_without_a_shared_store_shows_no_gateways_panel() {
        let html = body(&view(vec![card("web1", "answered 200 OK")]));
        assert!(!html.contains("id=\"gateways\"") && !html.contains("Redis"));
    }

    #[test]
    fn the_gateways_panel_shows_what_each_gateway_served_and_dealt_and_which_is_this_one() {
        let mut page = view(vec![card("web1", "answered 200 OK")]);
        let peers = vec![peer("gw-a", &[("web1", 40)]), peer("gw-b", &[("web1", 12)])];
        page.gateways = Some(panel(Ok(peers), true));
        let html = body(&page);
        assert!(html.contains("data-store=\"connected\""));
        assert!(html.contains("<td>gw-a<span class=\"badge\">this gateway</span></td>"));
        assert!(html.contains(
            "<tr data-gateway=\"gw-b\"><td>gw-b</td><td>0.9.0</td><td>1m</td><td>0.4s ago</td>"
        ));
        let gw_b = html.split("data-gateway=\"gw-b\"").nth(1).unwrap();
        assert!(gw_b.contains("<td data-node=\"web1\">12 / 2</td>"));
        assert!(
            gw_b.contains("<td data-node=\"data\">? / ?</td>"),
            "not in its beat"
        );
        for (key, value) in [
            ("fallback-lookup", 2),
            ("fallback-deal", 5),
            ("unwritten", 7),
            ("outages", 1),
        ] {
            assert!(
                html.contains(&format!("data-figure=\"{key}\">{value}<")),
                "{key}"
            );
        }
        assert!(!html.contains(gateways_panel::UNREACHABLE));
    }

    #[test]
    fn a_hostile_gateway_name_version_and_node_name_in_a_heartbeat_are_shown_as_text() {
        let hostile = "gw\"><script>alert(1)</script>";
        let mut beat = peer(hostile, &[("<img src=x onerror=alert(2)>", 1)]);
        beat.version = Some("<b>9</b>".into());
        let mut page = view(Vec::new());
        let mut shown = panel(Ok(vec![beat]), true);
        shown.this = "<i>me</i>".into();
        shown.nodes.push("<img src=x onerror=alert(2)>".into());
        page.gateways = Some(shown);
        let html = body(&page);
        assert!(!html.contains("<script>") && !html.contains("<img") && !html.contains("<b>9"));
        assert!(html.contains("data-gateway=\"gw&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;\""));
        assert!(html.contains("<td>gw&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;</td>"));
        assert!(html.contains("&lt;img src=x onerror=alert(2)&gt;<br>"));
        assert!(html.contains("&lt;b&gt;9&lt;/b&gt;") && html.contains("&lt;i&gt;me&lt;/i&gt;"));
    }

    #[test]
    fn with_redis_down_the_panel_warns_instead_of_listing_and_still_counts() {
        let mut page = view(Vec::new());
        page.gateways = Some(panel(Err("Redis is unreachable".into()), false));
        let html = body(&page);
        assert!(html.contains(&format!(
            "role=\"alert\" data-store=\"unreachable\">{}",
            &*markup!(gateways_panel::UNREACHABLE)
        )));
        assert!(!html.contains("<th>Gateway</th>"), "no table");
        assert!(
            !html.contains("could not be listed"),
            "one warning, not two"
        );
        assert!(html.contains("data-figure=\"outages\">1<"));
        // Connected, but the list did not come (a stalled Redis): the reason instead.
        page.gateways = Some(panel(Err("Redis did not answer within 1 s".into()), true));
        let html = body(&page);
        assert!(html.contains("The gateways could not be listed: Redis did not answer within 1 s"));
        assert!(!html.contains(gateways_panel::UNREACHABLE));
    }

    #[test]
    fn a_found_session_says_which_gateway_bound_it_as_text() {
        let row = || Row {
            hash: "00ff00ff00ff00ff".into(),
            node: "web1".into(),
            state: SessionState::LoggedIn,
            age: 60,
            idle: 2,
            requests: 4,
        };
        let mut page = view(Vec::new());
        let bound_by = Some("gw-<b>".into());
        page.found = Some(Ok(Found {
            row: row(),
            bound_by,
        }));
        let html = body(&page);
        assert!(
            html.contains("4 requests, bound by <b data-found=\"bound-by\">gw-&lt;b&gt;</b>.</p>")
        );
        page.found = Some(Ok(Found {
            row: row(),
            bound_by: None,
        }));
        assert!(
            body(&page).contains("4 requests.</p>"),
            "without a shared store"
        );
    }
}

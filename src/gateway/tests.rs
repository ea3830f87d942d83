//! The routing rule, row by row: every case of [`Gateway::route`] and of the
//! failover rule in [`Gateway::sticky`], each written as what a student's request is,
//! what is known of its session, and the state of the site, beside where it must go.

use super::*;
use crate::config::{Config, NodeState};
use crate::moodle::PageKind;
use crate::sessions::clock::Clock;

/// What the session table knows of the request's session.
#[derive(Debug, Clone, Copy)]
enum Session {
    /// Nothing: a new visitor, a forged or expired id, or no cookie at all.
    Unknown,
    /// Bound to web1.
    OnWeb1,
    /// Bound to a node that has since left the config.
    OnRemovedNode,
}

/// The site's state around the request.
#[derive(Debug, Clone, Copy, Default)]
struct Site {
    node_local: bool,
    offload: bool,
    web1_down: bool,
    web1_draining: bool,
    web1_disabled: bool,
    /// web1 was drained and is back: in its slow start.
    web1_warming: bool,
    web2_down: bool,
    data_down: bool,
}

/// Where the request must go: a node by name, or only the kind of route where
/// either node would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Goes {
    Data,
    Sticky(&'static str),
    Moved(&'static str),
    /// Moved to whichever node the deal gives.
    Redealt,
    Deal,
    Spread,
    Refused(StatusCode),
}

use http::StatusCode;
use Goes::*;
use Session::*;

const PAGE: RequestKind = RequestKind::Page(PageKind::Other);
const SCORM: RequestKind = RequestKind::ScormFile;
const ASSET: RequestKind = RequestKind::Sessionless;

fn site() -> Site {
    Site::default()
}

/// A gateway in front of web1, web2 and the data server, none of which is ever
/// reached: routing decides before anything is sent.
fn gateway(site: Site) -> Gateway {
    let store = if site.node_local {
        "node-local"
    } else {
        "shared"
    };
    let mut text = format!(
        "[session]\nstore = \"{store}\"\nfailover_hold = \"1ms\"\n\
         [[nodes]]\nname = \"web1\"\nurl = \"http://127.0.0.1:1\"\n\
         [[nodes]]\nname = \"web2\"\nurl = \"http://127.0.0.1:2\"\n\
         [data]\nname = \"data\"\nurl = \"http://127.0.0.1:3\"\n"
    );
    if site.offload {
        text.push_str("[offload]\nurl = \"http://127.0.0.1:4\"\n");
    }
    let config = Config::parse(&text, std::path::Path::new("."), Default::default()).unwrap();
    let gateway = Gateway::new(&config, Clock::default());
    let settings = gateway.settings();
    let upstreams = &settings.upstreams;
    let down = |upstream: &Upstream| {
        while upstream.health.is_up() {
            upstream.health.failure(1);
        }
    };
    let (web1, web2) = (upstreams.nodes()[0].clone(), upstreams.nodes()[1].clone());
    if site.web1_down {
        down(&web1);
    }
    if site.web2_down {
        down(&web2);
    }
    if site.data_down {
        down(upstreams.data());
    }
    if site.web1_draining {
        web1.set_state(NodeState::Draining);
    }
    if site.web1_disabled {
        web1.set_state(NodeState::Disabled);
    }
    if site.web1_warming {
        web1.set_state(NodeState::Draining);
        web1.set_state(NodeState::Active);
        assert!(web1.share(upstreams.slow_start()) < crate::cluster::slow_start::FULL);
    }
    drop(settings);
    gateway
}

async fn route(kind: RequestKind, session: Session, site: Site) -> Goes {
    let gateway = gateway(site);
    let settings = gateway.settings();
    let upstreams = &settings.upstreams;
    let node = match session {
        Unknown => None,
        OnWeb1 => Some(upstreams.nodes()[0].id),
        OnRemovedNode => Some(NodeId::new(7).unwrap()),
    };
    let known = node.map(|node| Known {
        key: gateway.table.key("abcdefghijklmnopqrstuvwxyz"),
        node,
        state: SessionState::LoggedIn,
        idle: Duration::ZERO,
        recovered: false,
    });
    let name = |id: NodeId| upstreams.get(id).map(|n| &*n.name).unwrap();
    let name = |id: NodeId| -> &'static str {
        match name(id) {
            "web1" => "web1",
            "web2" => "web2",
            other => panic!("routed to {other}"),
        }
    };
    match gateway.route(kind, known, &mut None, &settings).await {
        Ok(Route::Data) => Data,
        Ok(Route::Sticky(id)) => Sticky(name(id)),
        Ok(Route::Moved(id)) => Moved(name(id)),
        Ok(Route::Deal(_)) => Deal,
        Ok(Route::Spread(_)) => Spread,
        Err(error) => Refused(error.status()),
    }
}

#[tokio::test]
async fn every_request_goes_where_the_routing_rule_says() {
    let unavailable = Refused(StatusCode::SERVICE_UNAVAILABLE);
    let down_shared = Site {
        web1_down: true,
        ..site()
    };
    let down_local = Site {
        node_local: true,
        ..down_shared
    };
    let offload = Site {
        node_local: true,
        offload: true,
        ..site()
    };
    #[rustfmt::skip]
    let rows: &[(RequestKind, Session, Site, Goes, &str)] = &[
        // Pages: a known session stays on its node while the node can serve it.
        (PAGE, OnWeb1, site(), Sticky("web1"), "its own node"),
        (PAGE, OnWeb1, Site { web1_draining: true, ..site() }, Sticky("web1"),
            "a draining node keeps its sessions"),
        (PAGE, OnWeb1, Site { web1_warming: true, ..site() }, Sticky("web1"),
            "a node in its slow start keeps its sessions: affinity always wins"),
        (PAGE, OnWeb1, down_shared, Moved("web2"), "shared store: another node at once"),
        (PAGE, OnWeb1, down_local, Moved("web2"), "node-local: another node after the hold"),
        (PAGE, OnWeb1, Site { web1_disabled: true, ..site() }, Moved("web2"),
            "a disabled node hands its sessions over"),
        (PAGE, OnWeb1, Site { node_local: true, web1_disabled: true, ..site() }, Moved("web2"),
            "at once, whatever the store"),
        (PAGE, OnRemovedNode, site(), Redealt, "its node left the config: re-dealt"),
        (PAGE, OnWeb1, Site { web2_down: true, ..down_shared }, unavailable,
            "nowhere to move it"),
        (PAGE, Unknown, site(), Deal, "a new visitor is dealt a node"),
        (PAGE, Unknown, Site { web1_down: true, web2_down: true, ..site() }, unavailable,
            "no node takes new sessions"),
        // Sessionless assets: never dealt, but a session's own node when it has one.
        (ASSET, Unknown, site(), Spread, "any node, outside the deal"),
        (ASSET, OnWeb1, site(), Sticky("web1"), "a missing asset is answered by PHP in the session"),
        // SCORM files: the data server, unless its export sends them for the nodes.
        (SCORM, Unknown, site(), Data, "the data server"),
        (SCORM, OnWeb1, site(), Data, "the data server, whatever the session"),
        (SCORM, OnWeb1, Site { data_down: true, ..site() }, unavailable,
            "no other copy to fail over to"),
        (SCORM, OnWeb1, offload, Sticky("web1"), "offload: its own node authorises it"),
        (SCORM, Unknown, offload, Spread, "offload, no session: any node will do"),
        (SCORM, OnWeb1, Site { web1_down: true, ..offload }, Moved("web2"),
            "offload: the session's failover rule"),
    ];
    let mut wrong = Vec::new();
    for &(kind, session, site, expected, why) in rows {
        let went = route(kind, session, site).await;
        let same = went == expected || (expected == Redealt && matches!(went, Moved(_)));
        if !same {
            wrong.push(format!(
                "{kind:?} {session:?} {site:?}: {went:?}, not {expected:?} ({why})"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

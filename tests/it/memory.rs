//! A 1 GiB download and a 1 GiB upload through the real `moodle-gateway` binary, with
//! its peak resident memory read from `/proc`: a proxy that buffered either would
//! need a gigabyte.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::Response;
use http_body_util::channel::Channel;
use http_body_util::BodyExt;

use crate::support::{self, config_for, start_binary};

const GIB: usize = 1 << 30;
const CHUNK: usize = 64 * 1024;
static ZEROS: [u8; CHUNK] = [0; CHUNK];
const PEAK_LIMIT_KIB: u64 = 64 * 1024;

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A node that streams 1 GiB on GET and counts what it receives on POST.
async fn gigabyte_node() -> SocketAddr {
    support::upstream(|request| async move {
        if request.method() == http::Method::POST {
            let mut body = request.into_body();
            let mut total = 0usize;
            while let Some(frame) = body.frame().await {
                total += frame.unwrap().into_data().map_or(0, |d| d.len());
            }
            return Response::new(Body::from(total.to_string()));
        }
        let (mut sender, body) = Channel::<Bytes>::new(4);
        tokio::spawn(async move {
            for _ in 0..GIB / CHUNK {
                if sender.send_data(Bytes::from_static(&ZEROS)).await.is_err() {
                    return;
                }
            }
        });
        Response::builder()
            .header("content-length", GIB.to_string())
            .body(Body::new(body))
            .unwrap()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_each_way_streams_through_in_flat_memory() {
    let node = gigabyte_node().await;
    let data = support::named_upstream("data").await;
    let gateway = start_binary(&config_for(&[node], data, ""));
    let base = format!("http://{}", gateway.addr);

    let response = support::client()
        .get(
            format!("{base}/pluginfile.php/5/mod_resource/content/1/big.iso")
                .parse()
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = response.into_body();
    let mut downloaded = 0usize;
    while let Some(frame) = body.frame().await {
        downloaded += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    assert_eq!(downloaded, GIB);

    let (mut sender, upload) = Channel::<Bytes>::new(4);
    tokio::spawn(async move {
        for _ in 0..GIB / CHUNK {
            sender.send_data(Bytes::from_static(&ZEROS)).await.unwrap();
        }
    });
    let request = http::Request::post(format!("{base}/repository/repository_ajax.php"))
        .header("content-length", GIB.to_string())
        .body(Body::new(upload))
        .unwrap();
    let response =
        tokio::time::timeout(Duration::from_secs(300), support::client().request(request))
            .await
            .unwrap()
            .unwrap();
    let echoed = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(echoed, GIB.to_string());

    let peak = peak_rss_kib(gateway.child.id());
    println!("gateway peak RSS after 1 GiB down + 1 GiB up: {peak} KiB");
    assert!(
        peak < PEAK_LIMIT_KIB,
        "peak RSS {peak} KiB, limit {PEAK_LIMIT_KIB} KiB"
    );
}

/// An offloaded 1 GiB file: the node names it, the export streams it, and the gateway
/// carries it without holding more than a few buffers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_offloaded_file_streams_through_in_flat_memory() {
    let export = gigabyte_node().await;
    let node = support::upstream(|_request| async {
        Response::builder()
            .header("content-type", "video/mp4")
            .header("x-accel-redirect", "/dataroot/filedir/ab/cd/abcd")
            .body(Body::empty())
            .unwrap()
    })
    .await;
    let data = support::named_upstream("data").await;
    let extra =
        format!("[session]\nstore = \"node-local\"\n[offload]\nurl = \"http://{export}\"\n");
    let gateway = start_binary(&config_for(&[node], data, &extra));
    let url = format!(
        "http://{}/pluginfile.php/5/mod_resource/content/1/lecture.mp4",
        gateway.addr
    );
    let response = support::client().get(url.parse().unwrap()).await.unwrap();
    assert_eq!(response.headers()["content-type"], "video/mp4");
    assert_eq!(
        response.headers()["content-length"],
        GIB.to_string().as_str()
    );
    let mut body = response.into_body();
    let mut downloaded = 0usize;
    while let Some(frame) = body.frame().await {
        downloaded += frame.unwrap().into_data().map_or(0, |d| d.len());
    }
    assert_eq!(downloaded, GIB);
    let peak = peak_rss_kib(gateway.child.id());
    println!("gateway peak RSS after a 1 GiB offloaded file: {peak} KiB");
    assert!(
        peak < PEAK_LIMIT_KIB,
        "peak RSS {peak} KiB, limit {PEAK_LIMIT_KIB} KiB"
    );
}

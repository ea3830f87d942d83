//! Slow uploads must not hold PHP workers: a small body is read whole before any node
//! is contacted, a larger one up to `spool_body_bytes` is kept on disk until whole
//! (issue #24), and one larger still streams only as long as it keeps a minimum pace
//! and a total deadline (issue #14, slowhttptest `-B`).

use std::time::Duration;

use crate::support::{self, config_for, named_upstream, RawConn, Record, TestGateway};

const WAIT: Duration = Duration::from_secs(20);

async fn gateway_for(node: std::net::SocketAddr, extra: &str) -> TestGateway {
    let data = named_upstream("data").await;
    TestGateway::start(&config_for(&[node], data, extra)).await
}

fn header<'a>(received: &'a support::Received, name: &str) -> Option<&'a str> {
    received
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Sends `head`, then `body` in 32-byte pieces 20 ms apart (a slowhttptest `-B`
/// client), checking before every piece that the node has seen nothing; then the
/// gateway's answer.
async fn trickle(gateway: &TestGateway, record: &Record, head: &str, body: &[u8]) -> u16 {
    let mut conn = RawConn::connect(gateway.addr).await;
    conn.send(head.as_bytes()).await.unwrap();
    for piece in body.chunks(32) {
        assert!(
            record.lock().unwrap().is_empty(),
            "the node was contacted before the body was complete"
        );
        conn.send(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    conn.response(WAIT, false).await.unwrap().status
}

#[tokio::test]
async fn a_trickled_small_body_reaches_the_node_only_once_complete_and_whole() {
    let form: Vec<u8> = (0..2048).map(|i| b'a' + (i % 26) as u8).collect();
    let mut chunked = Vec::new();
    for part in form.chunks(100) {
        chunked.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let framings = [
        ("content-length: 2048", form.clone()),
        ("transfer-encoding: chunked", chunked),
    ];
    for (framing, body) in framings {
        let (node, record) = support::recording_upstream().await;
        let gateway = gateway_for(node, "").await;
        let head = format!(
            "POST /mod/scorm/datamodel.php HTTP/1.1\r\nHost: moodle.example.edu\r\n{framing}\r\n\r\n"
        );
        assert_eq!(
            trickle(&gateway, &record, &head, &body).await,
            200,
            "{framing}"
        );
        let received = record.lock().unwrap().clone();
        assert_eq!(received.len(), 1, "{framing}: one request, sent once");
        let request = &received[0];
        assert_eq!(request.body.clone().unwrap().unwrap(), form, "{framing}");
        assert_eq!(header(request, "content-length"), Some("2048"), "{framing}");
        assert_eq!(header(request, "transfer-encoding"), None, "{framing}");
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn a_chunked_body_past_the_buffer_limit_streams_with_what_was_read_in_front() {
    let (node, record) = support::recording_upstream().await;
    let limits = "[limits]\nbuffer_body_bytes = \"1KiB\"\nspool_body_bytes = 0\n";
    let gateway = gateway_for(node, limits).await;
    let body = support::patterned(5000);
    let mut conn = RawConn::connect(gateway.addr).await;
    let head = "POST /repository/repository_ajax.php HTTP/1.1\r\nHost: moodle.example.edu\r\n\
                transfer-encoding: chunked\r\n\r\n";
    conn.send(head.as_bytes()).await.unwrap();
    for part in body.chunks(700) {
        let mut chunk = format!("{:x}\r\n", part.len()).into_bytes();
        chunk.extend_from_slice(part);
        chunk.extend_from_slice(b"\r\n");
        conn.send(&chunk).await.unwrap();
    }
    conn.send(b"0\r\n\r\n").await.unwrap();
    assert_eq!(conn.response(WAIT, false).await.unwrap().status, 200);
    let received = record.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body.clone().unwrap().unwrap(), body);
    assert_eq!(header(&received[0], "content-length"), None);
}

/// Sends a 10 MB upload in 1 KiB pieces `gap` apart until the gateway answers.
async fn crawl(gateway: &TestGateway, gap: Duration) -> support::RawResponse {
    let mut conn = RawConn::connect(gateway.addr).await;
    let head = "POST /backup/restorefile.php HTTP/1.1\r\nHost: moodle.example.edu\r\n\
                content-length: 10000000\r\n\r\n";
    conn.send(head.as_bytes()).await.unwrap();
    let answer = tokio::time::timeout(WAIT, async {
        loop {
            if conn.send(&[b'x'; 1024]).await.is_err() {
                break;
            }
            // A response (or a close) while sending: read it.
            match tokio::time::timeout(gap, conn.response(gap, false)).await {
                Ok(Ok(response)) => return response,
                Ok(Err(_)) | Err(_) => continue,
            }
        }
        conn.response(WAIT, false).await.unwrap()
    });
    answer.await.expect("the gateway answered the slow upload")
}

#[tokio::test]
async fn a_large_upload_slower_than_the_minimum_rate_is_answered_408() {
    let (node, record) = support::recording_upstream().await;
    let rules = "[limits]\nspool_body_bytes = 0\n\
                 [timeouts]\nupload_min_rate = \"64KiB\"\nupload_rate_window = \"1s\"\n";
    let gateway = gateway_for(node, rules).await;
    // About 10 KiB/s, a sixth of the floor.
    let response = crawl(&gateway, Duration::from_millis(100)).await;
    assert_eq!(response.status, 408);
    assert_eq!(
        String::from_utf8_lossy(&response.body),
        "request timeout: the upload arrived too slowly\n"
    );
    assert_eq!(response.header("connection"), Some("close"));
    // It streamed (too large to buffer), and the node saw it cut short.
    let received = record.lock().unwrap().clone();
    assert_eq!(received.len(), 1);
}

#[tokio::test]
async fn a_large_upload_past_the_total_deadline_is_answered_408() {
    let (node, _record) = support::recording_upstream().await;
    let rules = "[timeouts]\nupload_min_rate = \"0\"\nupload = \"1s\"\n";
    let gateway = gateway_for(node, rules).await;
    let response = crawl(&gateway, Duration::from_millis(50)).await;
    assert_eq!(response.status, 408);
    assert_eq!(
        String::from_utf8_lossy(&response.body),
        "request timeout: the upload took too long\n"
    );
}

/// `body` as chunked framing, in chunks of `size`.
fn chunked(body: &[u8], size: usize) -> Vec<u8> {
    let mut framed = Vec::new();
    for part in body.chunks(size) {
        framed.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        framed.extend_from_slice(part);
        framed.extend_from_slice(b"\r\n");
    }
    framed.extend_from_slice(b"0\r\n\r\n");
    framed
}

fn upload_head(framing: &str) -> String {
    format!("POST /mod/assign/view.php HTTP/1.1\r\nHost: moodle.example.edu\r\n{framing}\r\n\r\n")
}

/// An assignment-sized body, every byte telling where it belongs.
fn assignment(len: usize) -> Vec<u8> {
    support::patterned(len)
}

/// Sends `head`, then `body` in `piece`-byte pieces `gap` apart, asserting before
/// every piece that the node has seen nothing; then the gateway's answer.
async fn trickle_unseen(
    gateway: &TestGateway,
    record: &Record,
    head: &str,
    body: &[u8],
    piece: usize,
    gap: Duration,
) -> u16 {
    let mut conn = RawConn::connect(gateway.addr).await;
    conn.send(head.as_bytes()).await.unwrap();
    for (i, part) in body.chunks(piece).enumerate() {
        assert!(
            record.lock().unwrap().is_empty(),
            "the node was contacted after {i} of {} pieces",
            body.len().div_ceil(piece)
        );
        conn.send(part).await.unwrap();
        tokio::time::sleep(gap).await;
    }
    conn.response(WAIT, false).await.unwrap().status
}

#[tokio::test]
async fn a_trickled_upload_above_the_buffer_limit_reaches_the_node_only_once_whole() {
    let upload = assignment(48 * 1024);
    let framings = [
        ("content-length: 49152", upload.clone()),
        ("transfer-encoding: chunked", chunked(&upload, 3000)),
    ];
    for (framing, body) in framings {
        let (node, record) = support::recording_upstream().await;
        let gateway = gateway_for(node, "[limits]\nbuffer_body_bytes = \"1KiB\"\n").await;
        let gap = Duration::from_millis(10);
        let head = upload_head(framing);
        let status = trickle_unseen(&gateway, &record, &head, &body, 2048, gap).await;
        assert_eq!(status, 200, "{framing}");
        let received = record.lock().unwrap().clone();
        assert_eq!(received.len(), 1, "{framing}: one request, sent once");
        assert!(
            received[0].body.clone().unwrap().unwrap() == upload,
            "{framing}: the node got the body byte for byte"
        );
        assert_eq!(
            header(&received[0], "content-length"),
            Some("49152"),
            "{framing}"
        );
        assert_eq!(header(&received[0], "transfer-encoding"), None, "{framing}");
        let spool = gateway.app.gateway().spool().now();
        assert_eq!(
            (spool.spooled, spool.bodies, spool.bytes),
            (1, 0, 0),
            "{framing}"
        );
        gateway.shutdown().await;
    }
}

/// Waits up to 5 s for `done`.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen within 5 s");
}

/// Sends `head` and all of `body` but its last piece, and asserts that the node
/// is already reading it (it streams); then the rest, and the answer.
async fn streams(gateway: &TestGateway, record: &Record, head: &str, body: &[u8]) -> u16 {
    let mut conn = RawConn::connect(gateway.addr).await;
    conn.send(head.as_bytes()).await.unwrap();
    let (most, last) = body.split_at(body.len() - 100);
    conn.send(most).await.unwrap();
    until("the node seeing the unfinished upload", || {
        !record.lock().unwrap().is_empty()
    })
    .await;
    conn.send(last).await.unwrap();
    conn.response(WAIT, false).await.unwrap().status
}

#[tokio::test]
async fn an_upload_above_the_spool_limit_streams_as_it_arrives() {
    let (node, record) = support::recording_upstream().await;
    let limits = "[limits]\nbuffer_body_bytes = \"1KiB\"\nspool_body_bytes = \"16KiB\"\n";
    let gateway = gateway_for(node, limits).await;
    let upload = assignment(64 * 1024);
    let head = upload_head("content-length: 65536");
    assert_eq!(streams(&gateway, &record, &head, &upload).await, 200);
    let received = record.lock().unwrap().clone();
    assert!(received[0].body.clone().unwrap().unwrap() == upload);
    assert_eq!(gateway.app.gateway().spool().now().spooled, 0);
}

/// The descriptors of this process open on a file in `dir`.
fn open_in(dir: &std::path::Path) -> usize {
    let fds = std::fs::read_dir("/proc/self/fd").unwrap();
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

#[tokio::test]
async fn an_upload_abandoned_halfway_leaves_no_file_and_gives_its_disk_back() {
    let (node, record) = support::recording_upstream().await;
    let dir = support::TempDir(support::spool_dir());
    let limits = format!(
        "[limits]\nbuffer_body_bytes = \"1KiB\"\nspool_dir = {:?}\n",
        dir.0.display().to_string()
    );
    let gateway = gateway_for(node, &limits).await;
    let spool = gateway.app.gateway().spool().clone();
    let mut conn = RawConn::connect(gateway.addr).await;
    conn.send(upload_head("content-length: 65536").as_bytes())
        .await
        .unwrap();
    conn.send(&assignment(16 * 1024)).await.unwrap();
    until("the upload on disk", || {
        spool.now().bodies == 1 && open_in(&dir.0) == 1
    })
    .await;
    assert_eq!(spool.now().bytes, 65536, "its Content-Length is reserved");
    let names = std::fs::read_dir(&dir.0).unwrap().count();
    assert_eq!(names, 0, "a spooled upload has no name in spool_dir");
    drop(conn);
    until("the disk given back", || {
        spool.now().bodies == 0 && spool.now().bytes == 0 && open_in(&dir.0) == 0
    })
    .await;
    assert!(record.lock().unwrap().is_empty(), "no node saw any of it");
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
}

#[tokio::test]
async fn an_upload_that_finds_the_spool_full_streams_instead() {
    let (node, record) = support::recording_upstream().await;
    let limits = "[limits]\nbuffer_body_bytes = \"1KiB\"\nspool_body_bytes = \"1MiB\"\n\
                  spool_max_bytes = \"1MiB\"\n";
    let gateway = gateway_for(node, limits).await;
    let spool = gateway.app.gateway().spool().clone();
    // A first student takes the whole spool and keeps sending.
    let mut first = RawConn::connect(gateway.addr).await;
    first
        .send(upload_head("content-length: 1048576").as_bytes())
        .await
        .unwrap();
    first.send(&assignment(4096)).await.unwrap();
    until("the first upload on disk", || spool.now().bodies == 1).await;
    let upload = assignment(32 * 1024);
    let head = upload_head("content-length: 32768");
    assert_eq!(streams(&gateway, &record, &head, &upload).await, 200);
    let received = record.lock().unwrap().clone();
    assert!(received[0].body.clone().unwrap().unwrap() == upload);
    let now = spool.now();
    assert_eq!((now.spooled, now.full, now.bodies), (1, 1, 1));
    drop(first);
}

#[test]
fn a_spool_dir_the_gateway_cannot_create_stops_the_start_naming_the_key() {
    let dir = support::TempDir(support::spool_dir());
    std::fs::create_dir_all(&dir.0).unwrap();
    let file = dir.0.join("not-a-directory");
    std::fs::write(&file, "x").unwrap();
    let spool = file.join("spool");
    let config = format!(
        "listen = \"127.0.0.1:0\"\n[limits]\nspool_dir = {:?}\n\
         [[nodes]]\nname = \"web1\"\nurl = \"http://127.0.0.1:9\"\n\
         [data]\nname = \"data\"\nurl = \"http://127.0.0.1:10\"\n",
        spool.display().to_string()
    );
    let path = dir.0.join("config.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_moodle-gateway"))
        .current_dir(&dir.0)
        .args(["run", "--config"])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break Some(exit);
        }
        if started.elapsed() > Duration::from_secs(10) {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        exit.is_some_and(|e| !e.success()),
        "started anyway: {stderr}"
    );
    let expected = format!("limits.spool_dir: cannot create {}: ", spool.display());
    assert!(stderr.contains(&expected), "{stderr}");
}

/// How long a node held a 256 KiB upload trickled at 32 KiB/s (the issue's own
/// figure), with the spool off and on, as a ratio. A measurement, not a check of
/// speed: run it with `cargo test --test it uploads::measure -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "a measurement (16 s): run it by name with --ignored --nocapture"]
async fn measure_how_long_a_trickled_upload_holds_its_node() {
    let mut held = Vec::new();
    for spool in ["0", "\"64MiB\""] {
        let timings = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = timings.clone();
        let node = support::upstream(move |request: http::Request<hyper::body::Incoming>| {
            let seen = seen.clone();
            async move {
                use http_body_util::BodyExt;
                let arrived = std::time::Instant::now();
                // Health probes aside: only the upload is timed.
                let upload = request.method() == http::Method::POST;
                let body = request.into_body().collect().await.unwrap();
                if upload {
                    seen.lock()
                        .unwrap()
                        .push((arrived.elapsed(), body.to_bytes().len()));
                }
                http::Response::new(axum::body::Body::from("ok"))
            }
        })
        .await;
        let gateway = gateway_for(node, &format!("[limits]\nspool_body_bytes = {spool}\n")).await;
        let upload = assignment(256 * 1024);
        let mut conn = RawConn::connect(gateway.addr).await;
        conn.send(upload_head("content-length: 262144").as_bytes())
            .await
            .unwrap();
        for piece in upload.chunks(8 * 1024) {
            conn.send(piece).await.unwrap();
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert_eq!(conn.response(WAIT, false).await.unwrap().status, 200);
        let (took, len) = timings.lock().unwrap()[0];
        assert_eq!(len, upload.len());
        println!("spool_body_bytes = {spool}: the node held the upload {took:?}");
        held.push(took);
        gateway.shutdown().await;
    }
    let ratio = held[0].as_secs_f64() / held[1].as_secs_f64().max(1e-9);
    println!("streamed / spooled node hold time: {ratio:.0}x");
}

use super::*;
use http_body_util::StreamBody;

/// A directory of its own under the system's temporary one, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("spool-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        Self(path)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `parts` as a chunked body would arrive, frame by frame.
fn arriving(parts: Vec<Bytes>) -> impl Body<Data = Bytes, Error = BoxError> + Unpin {
    let frames = parts.into_iter().map(|p| Ok::<_, BoxError>(Frame::data(p)));
    StreamBody::new(futures_util::stream::iter(frames))
}

async fn read_back(mut spooled: Spooled) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(frame) = spooled.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        assert!(data.len() <= CHUNK, "read back in chunks, never whole");
        out.extend_from_slice(&data);
    }
    out
}

#[test]
fn reservations_are_bounded_and_given_back_when_dropped() {
    let spool = Spool::new(PathBuf::from("/nonexistent"), 100);
    let first = spool.reserve(60).unwrap();
    assert!(spool.reserve(41).is_none(), "past spool_max_bytes");
    let second = spool.reserve(40).unwrap();
    let now = spool.now();
    assert_eq!(
        (now.bodies, now.bytes, now.spooled, now.full),
        (2, 100, 2, 1)
    );
    drop(first);
    drop(second);
    let now = spool.now();
    assert_eq!((now.bodies, now.bytes), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_is_written_unnamed_and_read_back_byte_for_byte() {
    let dir = Dir::new("whole");
    let spool = Spool::new(dir.0.clone(), 1 << 30);
    spool.prepare().unwrap();
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let parts: Vec<Bytes> = body[1000..]
        .chunks(7000)
        .map(Bytes::copy_from_slice)
        .collect();
    let file = spool.reserve(1 << 20).unwrap().open().await.unwrap();
    let first = Bytes::copy_from_slice(&body[..1000]);
    let filled = file
        .fill(Some(first), &mut arriving(parts), 1 << 20)
        .await
        .unwrap();
    assert!(filled.ended && filled.after.is_none());
    assert_eq!(filled.spooled.len(), body.len() as u64);
    assert_eq!(
        spool.now().bytes,
        body.len() as u64,
        "a chunked body's reservation shrinks to what it wrote"
    );
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        0,
        "no name in the directory"
    );
    assert_eq!(read_back(filled.spooled).await, body);
    assert_eq!(
        spool.now(),
        SpoolNow {
            bodies: 0,
            bytes: 0,
            spooled: 1,
            full: 0
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_the_limit_stops_before_the_frame_that_would_pass_it() {
    let dir = Dir::new("overflow");
    let spool = Spool::new(dir.0.clone(), 1 << 30);
    spool.prepare().unwrap();
    let parts: Vec<Bytes> = (0..10u8).map(|i| Bytes::from(vec![i; 1000])).collect();
    let mut body = arriving(parts);
    let file = spool.reserve(4500).unwrap().open().await.unwrap();
    let filled = file.fill(None, &mut body, 4500).await.unwrap();
    assert!(!filled.ended);
    assert_eq!(filled.after.as_deref(), Some(&[4u8; 1000][..]));
    let on_disk = read_back(filled.spooled).await;
    assert_eq!(on_disk.len(), 4000);
    assert_eq!(&on_disk[3000..], &[3u8; 1000][..]);
    let next = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(next[0], 5, "the rest is left to stream");
}

#[test]
fn a_directory_open_to_others_or_under_a_file_is_refused_with_the_reason() {
    let dir = Dir::new("open");
    std::fs::create_dir_all(&dir.0).unwrap();
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let refused = Spool::new(dir.0.clone(), 1).prepare().unwrap_err();
    assert!(
        refused.contains("is open to other users (mode 755)"),
        "{refused}"
    );
    let file = dir.0.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let refused = Spool::new(file.join("spool"), 1).prepare().unwrap_err();
    assert!(refused.starts_with("cannot create"), "{refused}");
    let fresh = dir.0.join("fresh");
    Spool::new(fresh.clone(), 1).prepare().unwrap();
    let mode = std::fs::metadata(&fresh).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

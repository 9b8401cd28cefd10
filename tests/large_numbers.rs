//! Numbers past 2^32: a 5 GiB upload completes, its sha256 is right, and a ranged GET
//! across the 4 GiB boundary returns the right bytes.

mod common;
use common::*;
use sha2::Digest;

const BLOCK: usize = 1 << 20;
const LEN: u64 = 5 << 30;

/// Block `k` of the source: a fixed random MiB whose first 8 bytes are `k`.
fn block(base: &[u8], k: u64) -> Vec<u8> {
    let mut b = base.to_vec();
    b[..8].copy_from_slice(&k.to_le_bytes());
    b
}

fn expected_range(base: &[u8], start: u64, end_inclusive: u64) -> Vec<u8> {
    (start..=end_inclusive).map(|i| block(base, i / BLOCK as u64)[(i % BLOCK as u64) as usize]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_gib_upload_and_a_range_across_4_gib() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let base = pseudo_random(BLOCK, 77);
    let url = t.create(LEN).await;
    let split: u64 = (4 << 30) + (512 << 20); // the second PATCH starts past 2^32
    let hasher = std::sync::Arc::new(std::sync::Mutex::new(sha2::Sha256::new()));
    for (from, to) in [(0, split), (split, LEN)] {
        let (b, h) = (base.clone(), hasher.clone());
        let blocks = (from / BLOCK as u64)..(to / BLOCK as u64);
        let stream = futures::stream::iter(blocks.map(move |k| {
            let data = block(&b, k);
            h.lock().unwrap().update(&data);
            Ok::<_, std::io::Error>(data)
        }));
        let r =
            t.c.patch(&url)
                .header("Tus-Resumable", "1.0.0")
                .header("Content-Type", OCTET)
                .header("Upload-Offset", from.to_string())
                .header("Content-Length", (to - from).to_string())
                .body(reqwest::Body::wrap_stream(stream))
                .send()
                .await
                .unwrap();
        assert_eq!(r.status(), 204, "{:?}", r.text().await);
        assert_eq!(header_u64(&r, "upload-offset"), Some(to));
    }
    let want: [u8; 32] = hasher.lock().unwrap().clone().finalize().into();
    let h = t.head(&url).await;
    assert_eq!(header_u64(&h, "upload-offset"), Some(LEN));
    assert_eq!(header(&h, "etag").unwrap(), format!("\"{}\"", hex::encode(want)));

    let (a, b) = ((4u64 << 30) - 1000, (4u64 << 30) + 1000);
    let r = t.c.get(&url).header("Range", format!("bytes={a}-{b}")).send().await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(header(&r, "content-range").unwrap(), format!("bytes {a}-{b}/{LEN}"));
    assert!(r.bytes().await.unwrap().as_ref() == expected_range(&base, a, b).as_slice());
    let r = t.c.get(&url).header("Range", "bytes=-3").send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap().as_ref(), &expected_range(&base, LEN - 3, LEN - 1)[..]);
}

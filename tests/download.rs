//! Downloads: Range (RFC 9110 §14), If-Range, ETag, 416, Repr-Digest, Content-Disposition,
//! active types, concurrent readers.

mod common;
use common::*;

async fn finished(t: &Tus, data: &[u8], metadata: Option<&str>) -> String {
    let len = data.len().to_string();
    let mut h = vec![("Upload-Length", len.as_str())];
    if let Some(m) = metadata {
        h.push(("Upload-Metadata", m));
    }
    let r = t.post(&h).await;
    let url = t.abs(header(&r, "location").unwrap());
    assert_eq!(t.patch(&url, 0, data.to_vec(), &[]).await.status(), 204);
    url
}

#[tokio::test]
async fn ranges_validators_and_416() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(1_000_000, 9);
    let url = finished(&t, &data, None).await;
    let get = |range: Option<&str>, extra: Option<(&'static str, String)>| {
        let mut r = t.c.get(&url);
        if let Some(v) = range {
            r = r.header("Range", v);
        }
        if let Some((k, v)) = extra {
            r = r.header(k, v);
        }
        r.send()
    };
    let r = get(None, None).await.unwrap();
    assert_eq!(r.status(), 200);
    let etag = header(&r, "etag").unwrap().to_string();
    assert_eq!(etag, format!("\"{}\"", sha256_hex(&data)), "strong ETag from the sha256");
    assert_eq!(header(&r, "accept-ranges"), Some("bytes"));
    assert_eq!(header_u64(&r, "content-length"), Some(1_000_000));
    assert_eq!(r.bytes().await.unwrap().as_ref(), &data[..]);

    let r = get(Some("bytes=10-19"), None).await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(header(&r, "content-range"), Some("bytes 10-19/1000000"));
    assert_eq!(r.bytes().await.unwrap().as_ref(), &data[10..20]);
    let r = get(Some("bytes=-5"), None).await.unwrap();
    assert_eq!(r.bytes().await.unwrap().as_ref(), &data[999_995..]);
    let r = get(Some("bytes=999990-5000000"), None).await.unwrap();
    assert_eq!(header(&r, "content-range"), Some("bytes 999990-999999/1000000"));

    let r = get(Some("bytes=1000000-"), None).await.unwrap();
    assert_eq!(header(&r, "content-range"), Some("bytes */1000000"));
    problem(r, 416, "invalid_argument").await;

    let r = get(Some("bytes=0-1,5-6"), None).await.unwrap();
    assert_eq!(r.status(), 200, "multi-range: the whole body");
    assert_eq!(r.bytes().await.unwrap().len(), 1_000_000);

    let r = get(Some("bytes=0-9"), Some(("If-Range", etag.clone()))).await.unwrap();
    assert_eq!(r.status(), 206);
    let r = get(Some("bytes=0-9"), Some(("If-Range", "\"stale\"".into()))).await.unwrap();
    assert_eq!(r.status(), 200, "If-Range mismatch: the whole file");
    let r = get(None, Some(("If-None-Match", etag.clone()))).await.unwrap();
    assert_eq!(r.status(), 304);
}

#[tokio::test]
async fn disposition_and_active_types() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    // filename "report é.html", filetype "text/html"
    let md = "filename cmVwb3J0IMOpLmh0bWw=,filetype dGV4dC9odG1s";
    let url = finished(&t, b"<script>alert(1)</script>", Some(md)).await;
    let r = t.c.get(&url).send().await.unwrap();
    assert_eq!(header(&r, "content-type"), Some("text/html"));
    assert_eq!(header(&r, "content-disposition"), Some("attachment; filename=\"report _.html\"; filename*=UTF-8''report%20%C3%A9.html"));
    assert_eq!(header(&r, "x-content-type-options"), Some("nosniff"));
    let url = finished(&t, b"png", Some("filename YS5wbmc=,filetype aW1hZ2UvcG5n")).await;
    let r = t.c.get(&url).send().await.unwrap();
    assert_eq!(header(&r, "content-disposition"), Some("inline; filename=\"a.png\""));
    // A filetype that is not a media type falls back to octet-stream.
    let url = finished(&t, b"x", Some("filetype bm90IGEgdHlwZQ==")).await;
    let r = t.c.get(&url).send().await.unwrap();
    assert_eq!(header(&r, "content-type"), Some("application/octet-stream"));
}

#[tokio::test]
async fn unfinished_download_is_409_with_offset() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let url = t.create(10).await;
    assert_eq!(t.patch(&url, 0, b"abc".to_vec(), &[]).await.status(), 204);
    let r = t.c.get(&url).send().await.unwrap();
    assert_eq!(header(&r, "upload-offset"), Some("3"));
    let v = problem(r, 409, "upload_incomplete").await;
    assert_eq!(v["partial"]["cursor"], 3);
}

#[tokio::test]
async fn concurrent_downloads_do_not_block_each_other() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(8 << 20, 4);
    let url = finished(&t, &data, None).await;
    // A slow reader holds a response open while others complete.
    let slow = t.c.get(&url).send().await.unwrap();
    let mut all = Vec::new();
    for i in 0..8u64 {
        let c = t.c.clone();
        let u = url.clone();
        all.push(tokio::spawn(async move {
            let r = c.get(&u).header("Range", format!("bytes={}-{}", i << 20, (i << 20) + 99)).send().await.unwrap();
            r.bytes().await.unwrap()
        }));
    }
    for (i, h) in all.into_iter().enumerate() {
        let b = tokio::time::timeout(std::time::Duration::from_secs(30), h).await.expect("not blocked").unwrap();
        assert_eq!(b.as_ref(), &data[i << 20..(i << 20) + 100]);
    }
    assert_eq!(slow.bytes().await.unwrap().len(), data.len());
}

//! Downloads: Range (RFC 9110 §14), If-Range, ETag, 416, preconditions (RFC 9110 §13),
//! HEAD as GET without the body, Repr-Digest, Content-Disposition, active types, concurrent
//! readers.

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
    // A filetype that is not a media type falls back to octet-stream, an attachment.
    let url = finished(&t, b"x", Some("filetype bm90IGEgdHlwZQ==")).await;
    let r = t.c.get(&url).send().await.unwrap();
    assert_eq!(header(&r, "content-type"), Some("application/octet-stream"));
    assert_eq!(header(&r, "content-disposition"), Some("attachment"));
}

/// Only the passive types of the allowlist are `inline`: octet-stream (declared, or the
/// fallback of a type ferry cannot parse) and a text type in a charset other than UTF-8 or
/// US-ASCII are attachments; `nosniff` and the CSP sandbox are on every one.
#[tokio::test]
async fn anything_off_the_inline_allowlist_is_an_attachment() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    for (filetype, content_type, disposition) in [
        ("YXBwbGljYXRpb24vb2N0ZXQtc3RyZWFt", "application/octet-stream", "attachment"), // application/octet-stream
        ("dGV4dC9wbGFpbiwgdGV4dC9odG1s", "application/octet-stream", "attachment"),     // text/plain, text/html
        ("aW1hZ2UvcG5nOzs=", "application/octet-stream", "attachment"),                 // image/png;;
        ("dGV4dC9wbGFpbjsgY2hhcnNldD11dGYtNw==", "text/plain; charset=utf-7", "attachment"),
        ("dGV4dC9wbGFpbjsgY2hhcnNldD11dGYtOA==", "text/plain; charset=utf-8", "inline"),
    ] {
        let url = finished(&t, b"+ADw-script+AD4-", Some(&format!("filename YS50eHQ=,filetype {filetype}"))).await;
        for method in ["GET", "HEAD"] {
            let r = t.request(method, &url, &[], None).await;
            assert_eq!(r.status(), 200);
            assert_eq!(header(&r, "content-type"), Some(content_type), "{method} {content_type}");
            assert_eq!(header(&r, "content-disposition"), Some(format!("{disposition}; filename=\"a.txt\"").as_str()), "{method} {content_type}");
            assert_eq!(header(&r, "x-content-type-options"), Some("nosniff"));
            assert_eq!(header(&r, "content-security-policy"), Some("default-src 'none'; sandbox"));
        }
    }
}

/// RFC 9110 §14.1: positions are `1*DIGIT` — leading zeros and any number of digits. A first
/// position past the file is 416 however long; a last position past it is clipped; a suffix
/// longer than the file is all of it.
#[tokio::test]
async fn range_numbers_of_any_length() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(10_000, 5);
    let url = finished(&t, &data, None).await;
    let get = |range: &'static str| t.c.get(&url).header("Range", range).send();
    for range in [
        "bytes=-10000",
        "bytes=-18446744073709551615",
        "bytes=-99999999999999999999",
        "bytes=0-99999999999999999999999",
        "bytes=0-18446744073709551615",
        "bytes=0000-9999",
    ] {
        let r = get(range).await.unwrap();
        assert_eq!(r.status(), 206, "{range}");
        assert_eq!(header(&r, "content-range"), Some("bytes 0-9999/10000"), "{range}");
        assert_eq!(r.bytes().await.unwrap().as_ref(), &data[..], "{range}");
    }
    for range in [
        "bytes=10000-",
        "bytes=18446744073709551615-",
        "bytes=18446744073709551616-",
        "bytes=99999999999999999999999-",
        "bytes=10000-99999999999999999999",
    ] {
        let r = get(range).await.unwrap();
        assert_eq!(header(&r, "content-range"), Some("bytes */10000"), "{range}");
        problem(r, 416, "invalid_argument").await;
    }
    let r = get("bytes=00-01").await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(header(&r, "content-range"), Some("bytes 0-1/10000"));
    assert_eq!(r.bytes().await.unwrap().as_ref(), &data[..2]);
    let r = get("bytes=9998-0009999").await.unwrap();
    assert_eq!(header(&r, "content-range"), Some("bytes 9998-9999/10000"));
}

/// Several ranges — in one field line or in two (RFC 9110 §5.3 makes them one list) — get
/// 200 and the whole file.
#[tokio::test]
async fn several_ranges_or_range_lines_get_the_whole_file() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(1000, 6);
    let url = finished(&t, &data, None).await;
    for headers in
        [vec![("Range", "bytes=0-1,5-6")], vec![("Range", "bytes=0-1"), ("Range", "bytes=5-6")], vec![("Range", "bytes=0-1"), ("Range", "bytes=0-1")]]
    {
        let r = t.request("GET", &url, &headers, None).await;
        assert_eq!(r.status(), 200, "{headers:?}");
        assert_eq!(header(&r, "content-range"), None);
        assert_eq!(r.bytes().await.unwrap().as_ref(), &data[..], "{headers:?}");
    }
}

/// An empty file: a non-zero suffix range is satisfiable but selects nothing (RFC 9110
/// §14.1.1) → 200 with the empty file; an int-range (`bytes=0-`) or `bytes=-0` → 416.
#[tokio::test]
async fn ranges_of_an_empty_file() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let r = t.post(&[("Upload-Length", "0")]).await;
    let url = t.abs(header(&r, "location").unwrap());
    for method in ["GET", "HEAD"] {
        let r = t.request(method, &url, &[("Range", "bytes=-1")], None).await;
        assert_eq!(r.status(), 200, "{method}");
        assert_eq!(header_u64(&r, "content-length"), Some(0));
        assert_eq!(header(&r, "content-range"), None);
        for range in ["bytes=0-", "bytes=0-0", "bytes=-0"] {
            let r = t.request(method, &url, &[("Range", range)], None).await;
            assert_eq!(r.status(), 416, "{method} {range}");
            assert_eq!(header(&r, "content-range"), Some("bytes */0"));
        }
    }
}

/// RFC 9110 §13.1.1 If-Match (strong comparison, `*`), §13.1.4 If-Unmodified-Since (only
/// without If-Match; an invalid date is ignored) → 412 problem; §13.1.2 If-None-Match and
/// §13.1.3 If-Modified-Since (only without If-None-Match) → 304; in §13.2.2's order.
#[tokio::test]
async fn preconditions() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(1000, 7);
    let url = finished(&t, &data, None).await;
    let r = t.request("GET", &url, &[], None).await;
    let etag = header(&r, "etag").unwrap().to_string();
    let modified = header(&r, "last-modified").unwrap().to_string();
    let past = "Sun, 06 Nov 1994 08:49:37 GMT";
    let future = "Fri, 31 Dec 9999 23:59:59 GMT";
    let weak = format!("W/{etag}");
    let listed = format!("\"other\", {etag}");
    let get = |h: Vec<(&'static str, String)>| {
        let mut r = t.c.get(&url);
        for (k, v) in h {
            r = r.header(k, v);
        }
        r.send()
    };
    // 412, a problem with the file's validators.
    for h in [
        vec![("If-Match", "\"x\"".to_string())],
        vec![("If-Match", weak.clone())],
        vec![("If-Unmodified-Since", past.to_string())],
        vec![("If-Match", "\"x\"".to_string()), ("If-None-Match", "*".to_string())],
        vec![("If-Match", "\"x\"".to_string()), ("Range", "bytes=0-1".to_string())],
    ] {
        let r = get(h.clone()).await.unwrap();
        assert_eq!(header(&r, "etag"), Some(etag.as_str()), "{h:?}");
        assert_eq!(header(&r, "last-modified"), Some(modified.as_str()), "{h:?}");
        let v = problem(r, 412, "conflict").await;
        assert_eq!(v["retryable"], false);
    }
    // Preconditions that hold.
    for h in [
        vec![("If-Match", "*".to_string())],
        vec![("If-Match", etag.clone())],
        vec![("If-Match", listed.clone())],
        vec![("If-Match", "\"other\"".to_string()), ("If-Match", etag.clone())],
        vec![("If-Unmodified-Since", modified.clone())],
        vec![("If-Unmodified-Since", "not a date".to_string())],
        vec![("If-Match", etag.clone()), ("If-Unmodified-Since", past.to_string())],
        vec![("If-None-Match", "\"x\"".to_string())],
        vec![("If-Modified-Since", past.to_string())],
        vec![("If-None-Match", "\"x\"".to_string()), ("If-Modified-Since", future.to_string())],
    ] {
        let r = get(h.clone()).await.unwrap();
        assert_eq!(r.status(), 200, "{h:?}");
        assert_eq!(r.bytes().await.unwrap().as_ref(), &data[..], "{h:?}");
    }
    // 304.
    for h in [
        vec![("If-None-Match", "*".to_string())],
        vec![("If-None-Match", weak.clone())],
        vec![("If-None-Match", listed.clone())],
        vec![("If-Modified-Since", modified.clone())],
        vec![("If-Modified-Since", future.to_string())],
        vec![("If-Match", etag.clone()), ("If-None-Match", etag.clone())],
        vec![("If-None-Match", etag.clone()), ("Range", "bytes=0-1".to_string())],
    ] {
        let r = get(h.clone()).await.unwrap();
        assert_eq!(r.status(), 304, "{h:?}");
        assert_eq!(header(&r, "etag"), Some(etag.as_str()));
    }
    let r = get(vec![("If-Match", etag.clone()), ("Range", "bytes=0-1".to_string())]).await.unwrap();
    assert_eq!(r.status(), 206);
}

/// A plain HEAD (no Tus-Resumable) answers exactly what GET answers, minus the body (RFC 9110
/// §9.3.2), for every precondition, range and state; a HEAD with Tus-Resumable stays TUS's.
#[tokio::test]
async fn a_plain_head_is_the_get_without_its_body() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let data = pseudo_random(10_000, 8);
    let url = finished(&t, &data, Some("filename YS50eHQ=")).await;
    let etag = header(&t.request("GET", &url, &[], None).await, "etag").unwrap().to_string();
    let unfinished = t.create(10).await;
    let (url, unfinished, etag) = (url.as_str(), unfinished.as_str(), etag.as_str());
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (url, vec![]),
        (url, vec![("If-None-Match", "*")]),
        (url, vec![("If-None-Match", etag)]),
        (url, vec![("If-Match", "\"x\"")]),
        (url, vec![("If-Match", etag)]),
        (url, vec![("If-Unmodified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")]),
        (url, vec![("If-Modified-Since", "Fri, 31 Dec 9999 23:59:59 GMT")]),
        (url, vec![("Range", "bytes=10-19")]),
        (url, vec![("Range", "bytes=-99999999999999999999")]),
        (url, vec![("Range", "bytes=10000-")]),
        (url, vec![("Range", "bytes=0-1,5-6")]),
        (url, vec![("Range", "bytes=0-9"), ("If-Range", "\"old\"")]),
        (unfinished, vec![]),
        (unfinished, vec![("If-None-Match", "*")]),
    ];
    for (u, h) in cases {
        let get = t.request("GET", u, &h, None).await;
        let head = t.request("HEAD", u, &h, None).await;
        assert_eq!(head.status(), get.status(), "{u} {h:?}");
        let fields = |r: &reqwest::Response| {
            let mut v: Vec<(String, String)> =
                r.headers().iter().filter(|(k, _)| *k != "date").map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string())).collect();
            v.sort();
            v
        };
        assert_eq!(fields(&head), fields(&get), "{u} {h:?}");
        assert!(head.bytes().await.unwrap().is_empty());
    }
    // The TUS HEAD: 200 with the offset, unfinished or not.
    let r = t.head(unfinished).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "upload-offset"), Some("0"));
    assert_eq!(header(&r, "cache-control"), Some("no-store"));
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

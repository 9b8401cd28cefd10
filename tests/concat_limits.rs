//! Transcripts for the limits of a concatenation (TUS 1.0 §Concatenation) whose size is known
//! only after the final upload was created (concatenation-unfinished with deferred-length
//! parts), for a final that can never be built, and for what a final's answer may echo.

mod common;
use common::*;
use std::time::{Duration, Instant};

async fn deferred_partial(t: &Tus) -> String {
    let r = t.post(&[("Upload-Defer-Length", "1"), ("Upload-Concat", "partial")]).await;
    assert_eq!(r.status(), 201);
    t.abs(header(&r, "location").unwrap())
}

fn id_of(url: &str) -> &str {
    url.rsplit('/').next().unwrap()
}

/// Bytes of a response's status line and headers, as a proxy buffers them.
fn header_bytes(r: &reqwest::Response) -> usize {
    "HTTP/1.1 200 OK\r\n".len() + r.headers().iter().map(|(n, v)| n.as_str().len() + 2 + v.len() + 2).sum::<usize>() + 2
}

/// The new user's transcript: `--max-size 1000`, a final naming one deferred part three times,
/// then the part's length declared as 600 (a final of 1800 bytes). The declaration is refused
/// (413, nothing stored); a length that fits goes through and the final is built.
#[tokio::test]
async fn a_declared_part_length_cannot_push_a_final_past_max_size() {
    let s = Server::start(&["--max-size", "1000"]);
    let t = Tus::new(&s);
    let d = deferred_partial(&t).await;
    let r = t.post(&[("Upload-Concat", &format!("final;{d} {d} {d}"))]).await;
    assert_eq!(r.status(), 201);
    let fin = t.abs(header(&r, "location").unwrap());

    let p = problem(t.patch(&d, 0, vec![0; 600], &[("Upload-Length", "600")]).await, 413, "size_exceeded").await;
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains(id_of(&fin)) && detail.contains("1800 bytes") && detail.contains("1000"), "{p}");
    assert_eq!((p["retryable"].as_bool(), p["partial"]["cursor"].as_u64()), (Some(false), Some(0)), "{p}");
    let h = t.head(&d).await;
    assert_eq!((header(&h, "upload-offset"), header(&h, "upload-defer-length")), (Some("0"), Some("1")), "nothing stored, length still deferred");

    assert_eq!(t.patch(&d, 0, vec![7; 300], &[("Upload-Length", "300")]).await.status(), 204);
    let h = t.wait_complete(&fin).await;
    assert_eq!(header(&h, "upload-length"), Some("900"));

    // Its concat task shows its final progress, not "concatenating" at 0.
    let tasks = json(Api::new(&s).get("/api/v1/tasks").await).await;
    let task = tasks["tasks"].as_array().unwrap().iter().find(|t| t["kind"] == "concat").cloned().expect("a concat task");
    let task = Api::new(&s).wait_status(task["id"].as_str().unwrap(), "completed", 10).await;
    assert_eq!(task["progress"]["fraction"].as_f64(), Some(1.0), "{task}");
    assert_eq!(task["progress"]["message"], "concatenated 900 bytes", "{task}");

    // Parts with different lengths: the known ones already count ("at least").
    let (a, b) = (deferred_partial(&t).await, deferred_partial(&t).await);
    let r = t.post(&[("Upload-Concat", &format!("final;{a} {b}"))]).await;
    assert_eq!(r.status(), 201);
    assert_eq!(t.patch(&a, 0, vec![1; 600], &[("Upload-Length", "600")]).await.status(), 204);
    let p = problem(t.patch(&b, 0, vec![2; 500], &[("Upload-Length", "500")]).await, 413, "size_exceeded").await;
    assert!(p["detail"].as_str().unwrap().contains("1100 bytes"), "{p}");
    let c = deferred_partial(&t).await;
    let r = t.post(&[("Upload-Concat", &format!("final;{c} {c} {b}"))]).await;
    assert_eq!(r.status(), 201);
    let p = problem(t.patch(&c, 0, vec![], &[("Upload-Length", "600")]).await, 413, "size_exceeded").await;
    assert!(p["detail"].as_str().unwrap().contains("at least 1200 bytes"), "{p}");
}

/// A final whose parts' lengths passed every check but whose build can never succeed (here the
/// operator lowered `--max-size` meanwhile) fails for good and says so everywhere: HEAD, GET
/// and the files API answer 409 with the reason, not retryable; its task failed naming it; its
/// parts can be deleted, and so can the final.
#[tokio::test]
async fn a_final_that_can_never_be_built_says_why_and_frees_its_parts() {
    let mut s = Server::start(&["--max-size", "10000"]);
    let t = Tus::new(&s);
    let d = deferred_partial(&t).await;
    let r = t.post(&[("Upload-Concat", &format!("final;{d} {d} {d}"))]).await;
    assert_eq!(r.status(), 201);
    let fin = t.abs(header(&r, "location").unwrap());
    assert_eq!(t.patch(&d, 0, vec![5; 300], &[("Upload-Length", "600")]).await.status(), 204);

    s.restart_with(&["--max-size", "1000"]);
    let t = Tus::new(&s);
    let (d, fin) = (format!("{}/files/{}", s.base, id_of(&d)), format!("{}/files/{}", s.base, id_of(&fin)));
    assert_eq!(t.patch(&d, 300, vec![5; 300], &[]).await.status(), 204, "the part itself fits");

    let deadline = Instant::now() + Duration::from_secs(20);
    let h = loop {
        let h = t.head(&fin).await;
        if h.status() != 200 {
            break h;
        }
        assert!(Instant::now() < deadline, "the final never failed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(h.status(), 409);
    assert!(header(&h, "upload-offset").is_none());
    for r in [t.c.get(&fin).send().await.unwrap(), Api::new(&s).get(&format!("/api/v1/files/{}", id_of(&fin))).await] {
        let p = problem(r, 409, "size_exceeded").await;
        let detail = p["detail"].as_str().unwrap();
        assert!(detail.contains("could not be built") && detail.contains("1800 bytes") && detail.contains("1000 bytes"), "{p}");
        assert_eq!(p["retryable"], false, "{p}");
        assert!(p["recovery_hint"].as_str().unwrap().contains("delete it"), "{p}");
    }
    let tasks = json(Api::new(&s).get("/api/v1/tasks").await).await;
    let task = tasks["tasks"].as_array().unwrap().iter().find(|t| t["kind"] == "concat").cloned().expect("a concat task");
    let task = Api::new(&s).wait_status(task["id"].as_str().unwrap(), "failed", 10).await;
    assert!(task["error"]["message"].as_str().unwrap().contains("1800 bytes"), "{task}");

    // The part is free again, and the final goes when asked.
    let tus = [("Tus-Resumable", "1.0.0")];
    assert_eq!(t.request("DELETE", &d, &tus, None).await.status(), 204);
    assert_eq!(t.request("DELETE", &fin, &tus, None).await.status(), 204);
    assert_eq!(t.head(&fin).await.status(), 404);
}

/// A final names at most 100 parts, and they and its metadata share the metadata's 4 KiB, so
/// its HEAD stays under the 6 KiB of headers the README promises proxies. Parts are this
/// server's: relative URLs, or absolute ones naming the host the request was sent to.
#[tokio::test]
async fn a_final_names_at_most_100_parts_of_this_server() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let r = t.post(&[("Upload-Length", "1"), ("Upload-Concat", "partial")]).await;
    let rel = header(&r, "location").unwrap().to_string();
    let part = t.abs(&rel);
    assert_eq!(t.patch(&part, 0, b"x".to_vec(), &[]).await.status(), 204);

    let many = format!("final;{}", vec![rel.as_str(); 2000].join(" "));
    let p = problem(t.post(&[("Upload-Concat", &many)]).await, 400, "invalid_argument").await;
    assert!(p["detail"].as_str().unwrap().contains("at most 100 partial uploads; this one names 2000"), "{p}");

    // 100 parts (3 405 bytes answered) leave 691 bytes of metadata; one more is refused.
    let hundred = format!("final;{}", vec![rel.as_str(); 100].join(" "));
    let md = |n: usize| format!("{} {}", "k".repeat(n - 401), "AAAA".repeat(100));
    let p = problem(t.post(&[("Upload-Concat", &hundred), ("Upload-Metadata", &md(692))]).await, 400, "invalid_argument").await;
    assert!(p["detail"].as_str().unwrap().contains("at most 4096 bytes together"), "{p}");
    let r = t.post(&[("Upload-Concat", &hundred), ("Upload-Metadata", &md(691))]).await;
    assert_eq!(r.status(), 201);
    let fin = t.abs(header(&r, "location").unwrap());
    let h = t.wait_complete(&fin).await;
    assert_eq!(header(&h, "upload-length"), Some("100"));
    assert!(header_bytes(&h) < 6 * 1024, "{} bytes of headers", header_bytes(&h));

    // Another server's URL is refused, naming it; this server's absolute URL is fine.
    let id = id_of(&part);
    for foreign in [format!("http://evil.example/files/{id}"), format!("//evil.example/files/{id}"), format!("ftp://{}/files/{id}", s.addr())] {
        let p = problem(t.post(&[("Upload-Concat", &format!("final;{foreign}"))]).await, 400, "invalid_argument").await;
        assert!(p["detail"].as_str().unwrap().contains(&foreign), "{p}");
    }
    let r = t.post(&[("Upload-Concat", &format!("final;{part} {id}"))]).await;
    assert_eq!(r.status(), 201);
    let h = t.wait_complete(&t.abs(header(&r, "location").unwrap())).await;
    assert_eq!(header(&h, "upload-concat"), Some(format!("final;/files/{id} /files/{id}").as_str()));
}

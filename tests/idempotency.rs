//! Retried creation requests do the work once (issue 9, item 5): an identical final upload
//! POSTed twice, and plain creations carrying an `Idempotency-Key`
//! (draft-ietf-httpapi-idempotency-key-header). Keys are per principal and live as long as the
//! upload they created (deleting it frees the key).

mod common;
use common::*;

fn location(r: &reqwest::Response) -> String {
    header(r, "location").expect("Location").to_string()
}

async fn file_count(s: &Server) -> usize {
    json(client().get(s.url("/api/v1/files?limit=1000")).send().await.unwrap()).await["files"].as_array().unwrap().len()
}

#[tokio::test]
async fn the_same_final_posted_twice_is_one_final_and_one_concat_task() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let mut parts = Vec::new();
    for data in [&b"hello "[..], b"world"] {
        let r = t.post(&[("Upload-Length", &data.len().to_string()), ("Upload-Concat", "partial")]).await;
        let url = t.abs(&location(&r));
        assert_eq!(t.patch(&url, 0, data.to_vec(), &[]).await.status(), 204);
        parts.push(url);
    }
    let concat = format!("final;{} {}", parts[0], parts[1]);
    let first = t.post(&[("Upload-Concat", &concat), ("Upload-Metadata", "filename aGkudHh0")]).await;
    assert_eq!(first.status(), 201);
    // The client timed out and retries the identical request (parts named by relative URL now).
    let rel = format!("final;{} {}", parts[0].trim_start_matches(&s.base), parts[1].trim_start_matches(&s.base));
    let again = t.post(&[("Upload-Concat", &rel), ("Upload-Metadata", "filename aGkudHh0")]).await;
    assert_eq!(again.status(), 201);
    assert_eq!(location(&again), location(&first), "the retry gets the first final");
    let fin = t.abs(&location(&first));
    t.wait_complete(&fin).await;
    assert_eq!(t.download(&fin).await, b"hello world");
    let third = t.post(&[("Upload-Concat", &concat), ("Upload-Metadata", "filename aGkudHh0")]).await;
    assert_eq!(location(&third), location(&first), "also once the final is built");
    assert_eq!(file_count(&s).await, 3, "two parts and one final");
    let tasks = json(client().get(s.url("/api/v1/tasks")).send().await.unwrap()).await;
    let concats = tasks["tasks"].as_array().unwrap().iter().filter(|t| t["kind"] == "concat").count();
    assert_eq!(concats, 1, "one concat task: {tasks}");
    // Other metadata is another final.
    let other = t.post(&[("Upload-Concat", &concat), ("Upload-Metadata", "filename b3RoZXI=")]).await;
    assert_eq!(other.status(), 201);
    assert_ne!(location(&other), location(&first));
}

#[tokio::test]
async fn an_idempotency_key_returns_the_first_upload_and_refuses_another_request() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let key = "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"";
    let h = [("Upload-Length", "10"), ("Upload-Metadata", "filename YS50eHQ="), ("Idempotency-Key", key)];
    let first = t.post(&h).await;
    assert_eq!(first.status(), 201);
    let again = t.post(&h).await;
    assert_eq!(again.status(), 201);
    assert_eq!(location(&again), location(&first));
    // The bare (unquoted) form names the same key.
    let bare = t
        .post(&[("Upload-Length", "10"), ("Upload-Metadata", "filename YS50eHQ="), ("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")])
        .await;
    assert_eq!(location(&bare), location(&first));
    assert_eq!(file_count(&s).await, 1);

    // The same key with a different request: 422 conflict (the draft), nothing created.
    for other in [
        [("Upload-Length", "11"), ("Upload-Metadata", "filename YS50eHQ="), ("Idempotency-Key", key)],
        [("Upload-Length", "10"), ("Upload-Metadata", "filename Yi50eHQ="), ("Idempotency-Key", key)],
    ] {
        let v = problem(t.post(&other).await, 422, "conflict").await;
        assert!(v["detail"].as_str().unwrap().contains(location(&first).trim_start_matches("/files/")), "{v}");
    }
    assert_eq!(file_count(&s).await, 1);
    // Another key is another upload; no key is always a new upload.
    assert_ne!(location(&t.post(&[("Upload-Length", "10"), ("Idempotency-Key", "k2")]).await), location(&first));
    assert_ne!(location(&t.post(&[("Upload-Length", "10")]).await), location(&t.post(&[("Upload-Length", "10")]).await));

    // Deleting the upload frees its key.
    let url = t.abs(&location(&first));
    assert_eq!(t.request("DELETE", &url, &[("Tus-Resumable", "1.0.0")], None).await.status(), 204);
    let fresh = t.post(&h).await;
    assert_eq!(fresh.status(), 201);
    assert_ne!(location(&fresh), location(&first));
}

#[tokio::test]
async fn a_retried_creation_with_upload_does_not_append_twice() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let h = [("Tus-Resumable", "1.0.0"), ("Upload-Length", "10"), ("Content-Type", OCTET), ("Idempotency-Key", "with-body")];
    let first = t.request("POST", "/files/", &h, Some(b"hello".to_vec())).await;
    assert_eq!((first.status().as_u16(), header(&first, "upload-offset")), (201, Some("5")));
    let again = t.request("POST", "/files/", &h, Some(b"hello".to_vec())).await;
    assert_eq!(again.status(), 201);
    assert_eq!(location(&again), location(&first));
    assert_eq!(header(&again, "upload-offset"), Some("5"), "the body was not appended again");
    let url = t.abs(&location(&first));
    assert_eq!(t.patch(&url, 5, b"world".to_vec(), &[]).await.status(), 204);
    assert_eq!(t.download(&url).await, b"helloworld");
}

/// One notion of a valid key for uploads and tasks: 1 to 255 characters.
#[tokio::test]
async fn keys_are_validated_alike_for_uploads_and_tasks() {
    let s = Server::start(&[]);
    let t = Tus::new(&s);
    let api = Api::new(&s);
    let longest = "k".repeat(255);
    let too_long = "k".repeat(256);
    assert_eq!(t.post(&[("Upload-Length", "1"), ("Idempotency-Key", &longest)]).await.status(), 201);
    assert_eq!(api.start_raw("external", r#"{"job":"x"}"#, Some(&longest), None).await.status(), 201);
    for bad in [too_long.as_str(), "\"unterminated", "\"\""] {
        problem(t.post(&[("Upload-Length", "1"), ("Idempotency-Key", bad)]).await, 400, "invalid_argument").await;
        problem(api.start_raw("external", r#"{"job":"x"}"#, Some(bad), None).await, 400, "invalid_argument").await;
    }
}

//! The S3 a test talks to: its own moto server (tests/common/moto.rs), or, with
//! `FERRY_TEST_S3_BUCKET` set, a prefix of its own in that bucket of a real S3 server such as
//! the Garage `.ci/garage.sh` starts (`FERRY_TEST_S3_ENDPOINT`, `FERRY_TEST_S3_ACCESS_KEY_ID`,
//! `FERRY_TEST_S3_SECRET_ACCESS_KEY`, `FERRY_TEST_S3_REGION`). A real server checks signatures,
//! so the test's own requests (listing keys and multipart uploads, creating one behind ferry's
//! back) are signed, with object_store's SigV4 signer.
#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::HttpRequestBody;

use super::moto::Moto;

/// Where the test S3 is and who the tests sign as.
#[derive(Clone, Debug)]
pub struct S3Config {
    /// e.g. `http://127.0.0.1:3900` (no trailing slash).
    pub endpoint: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub region: String,
    /// `FERRY_TEST_S3_BUCKET`: one bucket every test shares, each under a prefix of its own;
    /// `None`: the tests create buckets (moto lets anyone do so, unsigned).
    pub shared_bucket: Option<String>,
}

impl S3Config {
    /// From `FERRY_TEST_S3_*`; the credentials default to moto's (`testing`, `us-east-1`).
    pub fn from_env() -> Option<S3Config> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Some(S3Config {
            endpoint: var("FERRY_TEST_S3_ENDPOINT")?.trim_end_matches('/').to_string(),
            access_key_id: var("FERRY_TEST_S3_ACCESS_KEY_ID").unwrap_or_else(|| "testing".into()),
            secret_access_key: var("FERRY_TEST_S3_SECRET_ACCESS_KEY").unwrap_or_else(|| "testing".into()),
            region: var("FERRY_TEST_S3_REGION").unwrap_or_else(|| "us-east-1".into()),
            shared_bucket: var("FERRY_TEST_S3_BUCKET"),
        })
    }

    /// The shared-bucket configuration, when `FERRY_TEST_S3_BUCKET` names one.
    pub fn shared() -> Option<S3Config> {
        S3Config::from_env().filter(|c| c.shared_bucket.is_some())
    }

    /// The `AWS_*` variables that point object_store (and ferry) at this S3.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", self.access_key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_access_key.clone()),
            ("AWS_REGION", self.region.clone()),
        ]
    }

    /// A request signed (SigV4) by object_store's own signer: `path` is `/bucket[/key]`, `query`
    /// its parameters; no body.
    pub fn request(&self, method: &str, path: &str, query: &[(&str, &str)]) -> reqwest::RequestBuilder {
        let mut url = url::Url::parse(&format!("{}{path}", self.endpoint)).expect("FERRY_TEST_S3_ENDPOINT is a URL");
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut signed = http::Request::builder().method(method.clone()).uri(url.as_str()).body(HttpRequestBody::empty()).unwrap();
        let credential = AwsCredential { key_id: self.access_key_id.clone(), secret_key: self.secret_access_key.clone(), token: None };
        AwsAuthorizer::new(&credential, "s3", &self.region).try_authorize(&mut signed, None).expect("sign the request");
        let mut req = reqwest::Client::builder().no_proxy().build().unwrap().request(method, url.as_str());
        for (name, value) in signed.headers() {
            req = req.header(name, value);
        }
        req
    }

    /// A signed request that must succeed; its body.
    pub async fn call(&self, method: &str, path: &str, query: &[(&str, &str)]) -> String {
        let r = self.request(method, path, query).send().await.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = r.status();
        let body = r.text().await.unwrap();
        assert!(status.is_success(), "{method} {path} {query:?}: {status}: {body}");
        body
    }

    /// ListObjectsV2 under `prefix`, every page: the keys.
    pub async fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let (mut keys, mut token) = (Vec::new(), None::<String>);
        loop {
            let mut q = vec![("list-type", "2"), ("prefix", prefix)];
            if let Some(t) = &token {
                q.push(("continuation-token", t));
            }
            let body = self.call("GET", &format!("/{bucket}"), &q).await;
            keys.extend(xml_values(&body, "Key"));
            token = xml_values(&body, "NextContinuationToken").into_iter().next();
            if token.is_none() || !body.contains("<IsTruncated>true</IsTruncated>") {
                return keys;
            }
        }
    }

    /// ListMultipartUploads under `prefix`: the upload ids (the tests leave far fewer than a
    /// page of 1 000).
    pub async fn multipart_uploads(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let body = self.call("GET", &format!("/{bucket}"), &[("uploads", ""), ("prefix", prefix)]).await;
        assert!(!body.contains("<IsTruncated>true</IsTruncated>"), "more than a page of multipart uploads: {body}");
        xml_values(&body, "UploadId")
    }

    /// CreateMultipartUpload of `key`; its upload id.
    pub async fn create_multipart(&self, bucket: &str, key: &str) -> String {
        let body = self.call("POST", &format!("/{bucket}/{key}"), &[("uploads", "")]).await;
        xml_values(&body, "UploadId").into_iter().next().unwrap_or_else(|| panic!("CreateMultipartUpload: {body}"))
    }
}

/// A test's S3: moto of its own with a bucket, or a fresh prefix in the shared bucket.
pub struct TestS3 {
    pub config: S3Config,
    pub bucket: String,
    /// `""` (moto: the bucket is the test's) or `tPID-NANOS/` (the shared bucket).
    root: String,
    moto: Option<Moto>,
}

/// A prefix no other test process or server uses: `tPID-NANOS/`.
pub fn unique_root() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("t{}-{nanos}/", std::process::id())
}

impl TestS3 {
    /// With `FERRY_TEST_S3_BUCKET`, a fresh prefix in that bucket; else moto with `bucket`
    /// created and `min_part` its smallest part but the last (see [`Moto::start`]).
    pub async fn start(bucket: &str, min_part: u64) -> TestS3 {
        if let Some(config) = S3Config::shared() {
            let bucket = config.shared_bucket.clone().unwrap();
            return TestS3 { config, bucket, root: unique_root(), moto: None };
        }
        let moto = Moto::start(bucket, min_part).await;
        let config = S3Config {
            endpoint: moto.endpoint.clone(),
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
            region: "us-east-1".into(),
            shared_bucket: None,
        };
        TestS3 { config, bucket: bucket.to_string(), root: String::new(), moto: Some(moto) }
    }

    /// Whether this is the test's own moto (which can be frozen, has no signature checks, …).
    pub fn moto(&self) -> Option<&Moto> {
        self.moto.as_ref()
    }

    /// The full key of `key` (relative to the root).
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.root)
    }

    /// `s3://BUCKET/ROOT/prefix`: where a store of this test keeps its objects.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{}{prefix}", self.bucket, self.root)
    }

    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.config.env()
    }

    /// Set [`TestS3::env`] in this process (tests run one per process under nextest).
    pub fn set_env(&self) {
        for (k, v) in self.env() {
            std::env::set_var(k, v);
        }
    }

    /// The test's keys, relative to its root (as [`TestS3::url`]'s prefix names them), but the
    /// store's mark (`.ferry-store-mark`, written at a server's first start).
    pub async fn keys(&self) -> Vec<String> {
        let keys = self.config.keys(&self.bucket, &self.root).await;
        keys.into_iter().filter(|k| !is_store_mark(k)).map(|k| k.strip_prefix(&self.root).expect("listed under the root").to_string()).collect()
    }

    /// The test's unfinished multipart uploads.
    pub async fn multipart_uploads(&self) -> Vec<String> {
        self.config.multipart_uploads(&self.bucket, &self.root).await
    }

    /// CreateMultipartUpload of `key` (relative to the root) behind ferry's back, as a writer
    /// that died right after creating one would leave it; its upload id.
    pub async fn create_multipart(&self, key: &str) -> String {
        self.config.create_multipart(&self.bucket, &self.key(key)).await
    }
}

/// The texts of every `<tag>…</tag>` in an S3 XML answer (entities decoded).
fn xml_values(body: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    body.split(open.as_str())
        .skip(1)
        .filter_map(|s| s.split(close.as_str()).next())
        .map(|v| v.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&"))
        .collect()
}

/// Whether an S3 key is a store's mark (`PREFIX/.ferry-store-mark`), which every server puts
/// under its blob prefix at its first start: listings of what uploads left skip it.
pub fn is_store_mark(key: &str) -> bool {
    key.rsplit('/').next() == Some(".ferry-store-mark")
}

//! A local S3 for tests: moto's server (`moto[server]` from PyPI, installed by `.ci/run` into
//! the test clients' venv, `common::python_venv`) on a free loopback port, one per test. Killed on drop.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Moto {
    child: Child,
    /// e.g. `http://127.0.0.1:41234`.
    pub endpoint: String,
}

fn moto_bin() -> PathBuf {
    super::venv::venv_bin("moto_server")
}

impl Moto {
    /// Start moto and create `bucket`. `min_part`: the smallest part (but the last) moto
    /// accepts in CompleteMultipartUpload, in bytes (S3's is 5 MiB).
    pub async fn start(bucket: &str, min_part: u64) -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(moto_bin())
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("S3_UPLOAD_PART_MIN_SIZE", min_part.to_string())
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn moto_server");
        let moto = Moto { child, endpoint: format!("http://127.0.0.1:{port}") };
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = http.put(format!("{}/{bucket}", moto.endpoint)).send().await {
                assert!(r.status().is_success(), "creating bucket {bucket}: {}", r.status());
                break;
            }
            assert!(Instant::now() < deadline, "moto_server did not answer on {}", moto.endpoint);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        moto
    }

    /// The `AWS_*` variables that point object_store (and ferry) at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Set [`Moto::env`] in this process (tests run one per process under nextest).
    pub fn set_env(&self) {
        for (k, v) in self.env() {
            std::env::set_var(k, v);
        }
    }

    /// Stop the server process (`SIGSTOP`) as a hung S3 behaves: the kernel still accepts
    /// connections, nothing answers. [`Moto::thaw`] continues it.
    pub fn freeze(&self) {
        assert!(Command::new("kill").args(["-STOP", &self.child.id().to_string()]).status().unwrap().success());
    }

    /// `SIGCONT` after [`Moto::freeze`].
    pub fn thaw(&self) {
        assert!(Command::new("kill").args(["-CONT", &self.child.id().to_string()]).status().unwrap().success());
    }

    /// ListMultipartUploads: the `<UploadId>`s of the bucket's unfinished multipart uploads.
    pub async fn multipart_uploads(&self, bucket: &str) -> Vec<String> {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let body = http.get(format!("{}/{bucket}?uploads", self.endpoint)).send().await.unwrap().text().await.unwrap();
        body.split("<UploadId>").skip(1).filter_map(|s| s.split("</UploadId>").next()).map(str::to_string).collect()
    }

    /// ListParts of every unfinished multipart upload of `key`: the sizes of their parts in
    /// bytes, in part-number order.
    #[allow(dead_code)]
    pub async fn part_sizes(&self, bucket: &str, key: &str) -> Vec<u64> {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let list = http.get(format!("{}/{bucket}?uploads&prefix={key}", self.endpoint)).send().await.unwrap().text().await.unwrap();
        let mut sizes = Vec::new();
        for upload in list.split("<UploadId>").skip(1).filter_map(|s| s.split("</UploadId>").next()) {
            let parts = http.get(format!("{}/{bucket}/{key}?uploadId={upload}", self.endpoint)).send().await.unwrap().text().await.unwrap();
            sizes.extend(parts.split("<Size>").skip(1).filter_map(|s| s.split("</Size>").next()).map(|n| n.parse::<u64>().unwrap()));
        }
        sizes
    }

    /// CreateMultipartUpload of `key` behind ferry's back (as a writer that died right after
    /// creating one would leave it); returns its upload id.
    pub async fn create_multipart(&self, bucket: &str, key: &str) -> String {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let body = http.post(format!("{}/{bucket}/{key}?uploads", self.endpoint)).send().await.unwrap().text().await.unwrap();
        body.split("<UploadId>")
            .nth(1)
            .and_then(|s| s.split("</UploadId>").next())
            .unwrap_or_else(|| panic!("CreateMultipartUpload: {body}"))
            .to_string()
    }

    /// ListObjectsV2: every key in the bucket but the stores' marks (`.ferry-store-mark`, one
    /// per prefix a server started on).
    pub async fn keys(&self, bucket: &str) -> Vec<String> {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let body = http.get(format!("{}/{bucket}?list-type=2", self.endpoint)).send().await.unwrap().text().await.unwrap();
        body.split("<Key>").skip(1).filter_map(|s| s.split("</Key>").next()).filter(|k| !super::s3::is_store_mark(k)).map(str::to_string).collect()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! The S3 client every writer, reader and composer of one store shares ([`Inner`]): object
//! names under the prefix, the marker objects, the multipart uploads (created, listed, aborted)
//! and the tail segments.

use std::collections::HashSet;

use bytes::BytesMut;
use futures::TryStreamExt;
use object_store::aws::AmazonS3;
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{MultipartId, ObjectStore, ObjectStoreExt};

use super::budget::Budget;
use super::errors::{bounded, corrupt, deadline_for, io, is_not_found, REQUEST_DEADLINE};
use super::state::Segment;
use super::writer::Parked;
use crate::blob::{BlobError, BlobResult};

/// What every writer, reader and composer of one S3 store shares: the client and its settings.
pub(super) struct Inner {
    pub(super) s3: AmazonS3,
    /// For the one request object_store does not offer (UploadPartCopy with a range; see
    /// [`Inner::copy_part`]), sent to a URL object_store signs.
    pub(super) http: reqwest::Client,
    pub(super) bucket: String,
    pub(super) prefix: String,
    /// The smallest part size (`[s3] part_size`): see [`fixed_part_size`].
    pub(super) floor: u64,
    /// Every request, observed ([`super::requests`]).
    pub(super) requests: super::requests::Requests,
    /// The part size of an upload of unknown length (`[s3] deferred_part_size`, at least
    /// `floor`).
    pub(super) deferred_part: u64,
    /// Where ListMultipartUploads goes ([`Inner::unmarked_multiparts`]).
    pub(super) listing: Listing,
    /// Store-wide bound on the bytes of open parts (`[s3] max_buffer`).
    pub(super) budget: Budget,
    /// Full parts of one writer sent at once (`[s3] parts_in_flight`).
    pub(super) parts_in_flight: usize,
    /// Whether a part may be sent while it is still being received ([`Inner::stream_part`]):
    /// only where its unsigned body cannot be changed on the way — an `https` endpoint, or
    /// one on this machine (a loopback address or `localhost`) — or where
    /// `AWS_UNSIGNED_PAYLOAD=true` asks for unsigned bodies. Elsewhere object_store sends
    /// whole parts with their sha256 under the signature.
    pub(super) stream_parts: bool,
    /// Open parts of writers that ended, for the next writer of the same upload here.
    pub(super) parked: Parked,
    /// The store refused an UploadPartCopy for good: compositions stream their sources.
    pub(super) cannot_copy: std::sync::atomic::AtomicBool,
    /// When [`crate::blob::BlobStore::ping`] last wrote its probe object.
    pub(super) write_probed: std::sync::Mutex<Option<std::time::Instant>>,
}

/// Path-style address of the bucket and the signing region, for the one request object_store
/// does not make: ListMultipartUploads.
pub(super) struct Listing {
    /// e.g. `http://127.0.0.1:9000/bucket` or `https://s3.eu-west-1.amazonaws.com/bucket`.
    pub(super) bucket_url: String,
    pub(super) region: String,
    /// object_store's own HTTP client (TLS, proxies and `AWS_ALLOW_HTTP` as for every other
    /// request).
    pub(super) http: object_store::client::HttpClient,
}

impl Inner {
    /// The part size of a new upload that will hold at most `hint` bytes: sized so its parts
    /// fit ([`super::state::fixed_part_size`]), or `[s3] deferred_part_size` when the length is
    /// unknown (0).
    pub(super) fn part_size_for(&self, hint: u64) -> u64 {
        match hint {
            0 => self.deferred_part,
            hint => super::state::fixed_part_size(hint, self.floor),
        }
    }

    pub(super) fn key(&self, name: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(name)
        } else {
            Path::from(format!("{}/{name}", self.prefix))
        }
    }
    pub(super) fn object(&self, id: &str) -> Path {
        self.key(id)
    }
    pub(super) fn created(&self, id: &str) -> Path {
        self.key(&format!("{id}.created"))
    }
    pub(super) fn mpu_dir(&self, id: &str) -> Path {
        self.key(&format!("{id}.mpu"))
    }
    pub(super) fn mpu_marker(&self, id: &str, mp: &str) -> Path {
        self.key(&format!("{id}.mpu/{}", hex::encode(mp)))
    }
    pub(super) fn tail_dir(&self, id: &str) -> Path {
        self.key(&format!("{id}.tail"))
    }
    pub(super) fn segment(&self, id: &str, seg: &Segment) -> Path {
        self.key(&format!("{id}.tail/{}", seg.name()))
    }

    pub(super) async fn exists(&self, p: &Path) -> BlobResult<Option<u64>> {
        match bounded(REQUEST_DEADLINE, self.s3.head(p)).await {
            Ok(m) => Ok(Some(m.size)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(io(e)),
        }
    }

    pub(super) async fn delete_quiet(&self, p: &Path) -> BlobResult<()> {
        match bounded(REQUEST_DEADLINE, self.s3.delete(p)).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(io(e)),
        }
    }

    /// Delete `keys` with as few requests as the store allows (object_store's `delete_stream`:
    /// DeleteObjects, up to 1 000 keys each), keys already gone included. Errors: the first key
    /// the store failed to delete for another reason.
    pub(super) async fn delete_all(&self, keys: Vec<Path>) -> BlobResult<()> {
        use futures::StreamExt;
        if keys.is_empty() {
            return Ok(());
        }
        let n = keys.len() as u64;
        let results: Vec<object_store::Result<Path>> = bounded(REQUEST_DEADLINE + std::time::Duration::from_millis(n * 10), async {
            Ok(self.s3.delete_stream(futures::stream::iter(keys.into_iter().map(Ok)).boxed()).collect().await)
        })
        .await
        .map_err(io)?;
        for r in results {
            match r {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(io(e)),
            }
        }
        Ok(())
    }

    pub(super) async fn list(&self, dir: &Path) -> BlobResult<Vec<Path>> {
        self.s3.list(Some(dir)).map_ok(|m| m.location).try_collect().await.map_err(io)
    }

    /// Abort every multipart upload of `id` but `keep`, and forget their markers. Multipart
    /// uploads no marker names (a writer died between CreateMultipartUpload and writing the
    /// marker) are found with ListMultipartUploads on the object's key and aborted too.
    pub(super) async fn abort_multiparts(&self, id: &str, keep: Option<&str>) -> BlobResult<()> {
        for marker in self.list(&self.mpu_dir(id)).await? {
            let Some(mp) = marker.filename().and_then(|h| hex::decode(h).ok()).and_then(|b| String::from_utf8(b).ok()) else { continue };
            if keep == Some(mp.as_str()) {
                continue;
            }
            self.abort_one(id, mp).await?;
            self.delete_quiet(&marker).await?;
        }
        match self.unmarked_multiparts(id).await {
            Ok(ids) => {
                for mp in ids.into_iter().filter(|m| keep != Some(m.as_str())) {
                    self.abort_one(id, mp).await?;
                }
            }
            // Best effort: a store without ListMultipartUploads leaves such orphans to the
            // bucket's AbortIncompleteMultipartUpload lifecycle rule.
            Err(e) => tracing::warn!(upload = id, error = %e, "listing multipart uploads to abort orphans failed"),
        }
        Ok(())
    }

    /// AbortMultipartUpload of `mp` on `id`'s object. A `404 NoSuchUpload` means it is gone only
    /// once ListMultipartUploads agrees (a stray 404 would otherwise leave it behind).
    pub(super) async fn abort_one(&self, id: &str, mp: String) -> BlobResult<()> {
        let path = self.object(id);
        match bounded(REQUEST_DEADLINE, self.s3.abort_multipart(&path, &MultipartId::from(mp.clone()))).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) && self.multipart_gone(&path, &mp).await => Ok(()),
            Err(e) if is_not_found(&e) => {
                Err(BlobError::Unavailable("S3 AbortMultipartUpload: 404 NoSuchUpload while the multipart upload is still listed".into()))
            }
            Err(e) => Err(io(e)),
        }
    }

    /// The ids of the unfinished multipart uploads of `id`'s object: ListMultipartUploads
    /// with the key as prefix (exact key matches only), signed with object_store's own
    /// credentials. For cleanup only, never for resume state (DESIGN §2).
    pub(super) async fn unmarked_multiparts(&self, id: &str) -> Result<Vec<String>, String> {
        let key = self.object(id).to_string();
        Ok(self.multiparts_under(&key).await?.into_iter().filter(|(k, _)| *k == key).map(|(_, u)| u).collect())
    }

    /// `(Key, UploadId)` of the unfinished multipart uploads whose key starts with `key`
    /// (ListMultipartUploads, its first page: up to 1000), signed with object_store's own
    /// credentials.
    pub(super) async fn multiparts_under(&self, key: &str) -> Result<Vec<(String, String)>, String> {
        let mut url = url::Url::parse(&self.listing.bucket_url).map_err(|e| e.to_string())?;
        url.query_pairs_mut().append_pair("prefix", key).append_pair("uploads", "");
        let cred = self.s3.credentials().get_credential().await.map_err(|e| e.to_string())?;
        let mut req = http::Request::get(url.as_str()).body(object_store::client::HttpRequestBody::empty()).map_err(|e| e.to_string())?;
        object_store::aws::AwsAuthorizer::new(&cred, "s3", &self.listing.region).try_authorize(&mut req, None).map_err(|e| e.to_string())?;
        let resp = self.listing.http.execute(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = resp.into_body().bytes().await.map_err(|e| e.to_string())?;
        let body = String::from_utf8_lossy(&body);
        if !status.is_success() {
            return Err(format!("ListMultipartUploads answered {status}: {}", body.chars().take(300).collect::<String>()));
        }
        Ok(parse_uploads(&body))
    }

    /// The blob id a key under the prefix belongs to (`<id>`, `<id>.created`, `<id>.mpu/…`,
    /// `<id>.tail/…`), `None` for keys outside the prefix or that name no blob (the probe).
    pub(super) fn id_of(&self, key: &str) -> Option<String> {
        let name = if self.prefix.is_empty() { key } else { key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')? };
        let id = name.split(['.', '/']).next()?;
        crate::blob::is_blob_id(id).then(|| id.to_string())
    }

    /// Delete the tail segments of `id` not in `keep`.
    pub(super) async fn delete_segments(&self, id: &str, keep: &HashSet<Path>) -> BlobResult<()> {
        let gone = self.list(&self.tail_dir(id)).await?.into_iter().filter(|p| !keep.contains(p)).collect();
        self.delete_all(gone).await
    }

    /// Everything stored for `id`, the finished object included.
    pub(super) async fn remove_all(&self, id: &str) -> BlobResult<()> {
        self.parked.forget(id);
        self.abort_multiparts(id, None).await?;
        let mut keys = self.list(&self.tail_dir(id)).await?;
        keys.push(self.object(id));
        keys.push(self.created(id));
        self.delete_all(keys).await
    }

    pub(super) async fn read_segments(&self, id: &str, segs: &[Segment], buf: &mut BytesMut) -> BlobResult<()> {
        buf.reserve(segs.iter().map(Segment::len).sum::<u64>() as usize);
        for s in segs {
            let got = bounded(REQUEST_DEADLINE, self.s3.get(&self.segment(id, s))).await.map_err(|e| corrupt(e, "a tail segment"))?;
            // Streamed into `buf` as it arrives: never a second copy of the segment in memory
            // (the caller reserved room for one).
            let start = buf.len();
            let mut body = got.into_stream();
            let read = bounded(deadline_for(s.len()), async {
                while let Some(chunk) = body.try_next().await? {
                    buf.extend_from_slice(&chunk);
                }
                Ok(())
            })
            .await;
            read.map_err(io)?;
            let n = (buf.len() - start) as u64;
            if n != s.len() {
                buf.truncate(start);
                return Err(BlobError::Io(std::io::Error::other(format!("tail segment {} has {n} bytes", s.name()))));
            }
        }
        Ok(())
    }

    /// Once the object is whole: every multipart upload of `id` (the completed one answers
    /// `NoSuchUpload`, which is fine), its markers, the tail and the `.created` marker go, in
    /// that order (the marker last: while it exists, a repeated finish finds the rest).
    pub(super) async fn finished_cleanup(&self, id: &str) -> BlobResult<()> {
        self.parked.forget(id);
        self.abort_multiparts(id, None).await?;
        // The marker last, in a request of its own: while it exists, a repeated finish finds
        // the rest.
        self.delete_segments(id, &HashSet::new()).await?;
        self.delete_quiet(&self.created(id)).await
    }
}

/// Whether parts may be streamed to `endpoint` ([`Inner::stream_parts`]): `https`, or a
/// loopback host.
pub(super) fn may_stream_parts(endpoint: &str) -> bool {
    let Ok(url) = url::Url::parse(endpoint) else { return false };
    url.scheme() == "https"
        || match url.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            None => false,
        }
}

/// `(Key, UploadId)` of each `<Upload>` in a ListMultipartUploads answer (XML entities of the
/// five predefined kinds decoded).
pub(super) fn parse_uploads(xml: &str) -> Vec<(String, String)> {
    pub(super) fn field(block: &str, name: &str) -> Option<String> {
        let start = block.find(&format!("<{name}>"))? + name.len() + 2;
        let end = start + block[start..].find(&format!("</{name}>"))?;
        Some(block[start..end].replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&"))
    }
    xml.split("<Upload>").skip(1).filter_map(|b| Some((field(b, "Key")?, field(b, "UploadId")?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_multipart_uploads_answers_parse() {
        let xml = "<?xml version=\"1.0\"?><ListMultipartUploadsResult><Bucket>b</Bucket><Upload><Key>up/a&amp;b</Key><UploadId>X1</UploadId>\
                   <Initiated>2026</Initiated></Upload><Upload><Key>up/c</Key><UploadId>Y2</UploadId></Upload></ListMultipartUploadsResult>";
        assert_eq!(parse_uploads(xml), vec![("up/a&b".to_string(), "X1".to_string()), ("up/c".to_string(), "Y2".to_string())]);
        assert_eq!(parse_uploads("<ListMultipartUploadsResult/>"), vec![]);
    }

    #[test]
    fn parts_stream_only_over_tls_or_loopback() {
        for yes in [
            "https://s3.eu-west-1.amazonaws.com",
            "https://10.0.0.5:3900",
            "http://127.0.0.1:3900",
            "http://127.1.2.3:9000/",
            "http://[::1]:9000",
            "http://localhost:9000",
        ] {
            assert!(may_stream_parts(yes), "{yes}");
        }
        for no in ["http://10.0.0.5:3900", "http://s3.internal:9000", "http://localhost.example.com", "not a url", ""] {
            assert!(!may_stream_parts(no), "{no}");
        }
    }
}

//! `--parallel N`: N partial uploads side by side, then the final upload that joins them
//! (TUS 1.0 §Concatenation), verified against one sequential sha256 of the whole file.

use super::send::{hash_file, push};
use super::*;

/// Upload as `n` partial uploads plus a final one (TUS 1.0 §Concatenation).
pub(super) async fn concatenated(job: &Job<'_>, stored: Option<crate::cli::store::Entry>, n: usize) -> Result<Outcome, CliError> {
    let size = job.size;
    let ranges: Vec<(u64, u64)> = (0..n as u64).map(|i| (i * size / n as u64, (i + 1) * size / n as u64)).collect();
    let hasher = tokio::spawn(hash_file(job.path.clone(), job.display.clone()));
    let local = || async { hasher.await.map_err(|e| CliError::new(EXIT_FAILURE, format!("hashing failed: {e}")))? };
    // A final upload from an earlier run: it only needs to finish and be verified.
    if let Some(e) = stored.as_ref().filter(|e| e.final_url.is_some()) {
        let url = job.client.resolve(e.final_url.as_deref().unwrap_or_default())?;
        let mut retry = Retry::new(job.retry_for);
        let found = head(job.client, &mut retry, &url).await;
        let damaged = found.is_ok() && damaged_on_server(job.client, &url).await;
        match found {
            Ok(_) if damaged => {
                job.progress.note(&format!("the remembered upload {url} is damaged on the server (downloads are refused); starting over"))
            }
            Ok(_) => {
                job.progress.note(&format!("the parts were already joined into {url}"));
                job.progress.set(size, false);
                let server = wait_final(job, &url).await?;
                let parts = e.parts.iter().filter_map(|p| job.client.resolve(p).ok()).collect();
                return Ok(Outcome { url, resumed_from: size, local: local().await?, server, parts });
            }
            Err(e) if e.code == EXIT_NOT_FOUND => job.progress.note(&format!("the remembered upload {url} is gone; starting over")),
            Err(e) => return Err(e),
        }
    }
    let mut parts: Vec<(reqwest::Url, u64)> = Vec::new();
    if let Some(e) = stored.filter(|e| e.final_url.is_none() && e.parts.len() == n) {
        for (u, (a, b)) in e.parts.iter().zip(&ranges) {
            let url = job.client.resolve(u)?;
            match usable(job, &url, b - a).await? {
                Some(o) => parts.push((url, o)),
                None => {
                    parts.clear();
                    break;
                }
            }
        }
    }
    let resumed_from: u64 = parts.iter().map(|(_, o)| o).sum();
    let part_urls = |parts: &[(reqwest::Url, u64)]| parts.iter().map(|(u, _)| u.to_string()).collect::<Vec<_>>();
    if parts.is_empty() {
        // Named after the file, so `ferry ls` shows what they are if the join never happens.
        let name = job.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| job.display.clone());
        for (k, (a, b)) in ranges.iter().enumerate() {
            let meta = metadata_header(Some(&format!("{name}.part{}of{n}", k + 1)), &[]);
            parts.push((create(job, b - a, &meta, Some("partial")).await?, 0));
        }
        job.remember(&part_urls(&parts), None, &job.meta)?;
    } else {
        job.progress.note(&format!("resuming {n} parts with {resumed_from} of {size} bytes on the server"));
    }
    let sends = parts.iter().zip(&ranges).map(|((url, off), (a, b))| push(job, url, *a, b - a, *off, None));
    futures::future::try_join_all(sends).await?;
    let list: Vec<&str> = parts.iter().map(|(u, _)| u.path()).collect();
    let joined = match create(job, size, &job.meta, Some(&format!("final;{}", list.join(" ")))).await {
        Ok(final_url) => {
            job.remember(&part_urls(&parts), Some(final_url.as_str()), &job.meta)?;
            wait_final(job, &final_url).await.map(|server| (final_url, server))
        }
        Err(e) => Err(e),
    };
    let (final_url, server) = match joined {
        Ok(j) => j,
        Err(e) if e.is_server_code("insufficient_storage") => {
            // The join copies the file: the server needs its size free a second time.
            let ids: Vec<&str> = parts.iter().filter_map(|(u, _)| u.path_segments()?.next_back()).collect();
            return Err(e.hint(format!(
                "The {n} parts are stored and kept: re-run this command once the server has room for the file a second \
                 time (joining copies it) and it joins them; or remove them (`ferry rm {}`) and upload without --parallel.",
                ids.join(" ")
            )));
        }
        Err(e) => {
            // The server refused or discarded the joined upload because its declared sha256
            // does not match (a 460, or the final is gone at once and the file's sha256 is
            // not the declared one): keep the finished parts, forget the final, so a re-run
            // joins them again.
            let rejected = e.is_server_code("checksum_mismatch")
                || (e.code == EXIT_NOT_FOUND
                    && match job.declared_sha256() {
                        Some(declared) => declared != local().await?,
                        None => false,
                    });
            if !rejected {
                return Err(e);
            }
            // No metadata remembered: the next run joins them with its own --meta.
            job.remember(&part_urls(&parts), None, "")?;
            return Err(CliError::new(
                EXIT_VERIFY,
                format!("the file's sha256 does not match the declared --meta sha256: the server discarded the joined upload ({})", e.message),
            )
            .hint("Check --meta sha256=… (or leave it out); a re-run joins the parts already on the server again."));
        }
    };
    let parts = parts.into_iter().map(|(u, _)| u).collect();
    Ok(Outcome { url: final_url, resumed_from, local: local().await?, server, parts })
}

impl Job<'_> {
    /// The sha256 the upload's metadata declares (`--meta sha256=…`), lowercase.
    pub(super) fn declared_sha256(&self) -> Option<String> {
        let md: UploadMetadata = self.meta.parse().ok()?;
        md.get_str("sha256").map(|v| v.trim().to_ascii_lowercase())
    }
}

/// Poll a final upload until the server has joined its parts (HEAD shows `Upload-Offset`
/// equal to `Upload-Length`); returns its sha256. Gives up after `--retry-for` or 10
/// minutes, whichever is longer (re-running resumes the wait).
pub(super) async fn wait_final(job: &Job<'_>, url: &reqwest::Url) -> Result<String, CliError> {
    let deadline = std::time::Instant::now() + job.retry_for.max(Duration::from_secs(600));
    let mut pause = Duration::from_millis(50);
    let mut noted = false;
    loop {
        let mut retry = Retry::new(job.retry_for);
        let info = head(job.client, &mut retry, url).await?;
        if let (Some(o), Some(l)) = (info.offset, info.length) {
            if o == l {
                // Every byte is there; the server may still be finishing it (a pre-finish hook).
                return finished_sha256(job.client, job.retry_for, url, l).await;
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err(CliError::new(crate::cli::client::EXIT_NETWORK, format!("the server has not finished joining the parts into {url}"))
                .hint("Re-run the same command later to check it again."));
        }
        if !noted && pause >= Duration::from_millis(800) {
            job.progress.note("waiting for the server to join the parts");
            noted = true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

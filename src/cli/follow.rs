//! `ferry download --follow ID|URL`: download a file that may still be arriving.
//!
//! One `GET …?follow=1` with `TE: trailers` (hyper, like any HTTP/1.1 server, sends trailer
//! fields only to a client that says it accepts them, RFC 9110 §10.1.4): the server sends the
//! bytes committed so far, then each commit, and ends with the whole file's sha256 as a
//! `Repr-Digest` trailer (RFC 9530) — or as a header when the file was finished already. The
//! sha256 of every byte written is compared with it; a body that ends without it (an upload
//! terminated or expired, a proxy that drops trailers) or with another one fails (exit 4) and
//! the partial file goes. A connection cut mid-way is resumed with `Range: bytes=N-` within
//! `--retry-for`; an answer that starts over (a file of unknown length) starts the file over.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::BodyExt as _;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::client::{
    describe, header_str, id_of, print_line, repr_digest_sha256, stdout_error, typed_header, CliError, Client, Retry, EXIT_FAILURE, EXIT_VERIFY,
};
use super::download::{disposition_filename, output_for, part_path, replace, Done, DownloadArgs, Output, Probe};
use super::progress::Progress;
use ferry_tus::ContentRange;

/// A follower may wait this long for the next byte (the upload may pause): the server ends a
/// follow that can no longer finish, so the client need not guess sooner.
pub const FOLLOW_READ_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Run `ferry download --follow` (see the module docs).
pub async fn execute(args: DownloadArgs) -> Result<(), CliError> {
    let mut client = Client::new(&args.conn, FOLLOW_READ_TIMEOUT)?;
    let mut url = client.file_url(&args.target)?;
    client.discover_at(&url);
    url.query_pairs_mut().append_pair("follow", "1");
    let mut retry = Retry::new(args.retry_for);
    let what = describe(&reqwest::Method::GET, &url);
    let send = |pos: u64| {
        let mut r = client.request(reqwest::Method::GET, &url).header("te", "trailers");
        if pos > 0 {
            r = r.header("range", format!("bytes={pos}-"));
        }
        r
    };
    let res = client.send_retrying(&mut retry, &what, || send(0)).await?;
    if !res.status().is_success() {
        let status = res.status().as_u16();
        return Err(CliError::from_status(&what, status, &res.text().await.unwrap_or_default()));
    }
    let h = res.headers();
    let total: Option<u64> = res.content_length().or_else(|| typed_header(h, "upload-length"));
    let probe = Probe {
        total: total.unwrap_or(u64::MAX),
        etag: None,
        sha256: repr_digest_sha256(h),
        filename: header_str(h, "content-disposition").and_then(disposition_filename),
        content_type: None,
    };
    let server_name = || PathBuf::from(probe.filename.clone().unwrap_or_else(|| id_of(&url)));
    let (shown, output) = match &args.output {
        Some(p) if p.as_os_str() == "-" => (PathBuf::from("-"), Output::Stdout),
        Some(p) => {
            let p = if std::fs::metadata(p).is_ok_and(|m| m.is_dir()) { p.join(server_name()) } else { p.clone() };
            let o = output_for(&p, args.force, &Probe { sha256: None, ..probe.clone() }).await?;
            (p, o)
        }
        None => {
            let p = server_name();
            let o = output_for(&p, args.force, &Probe { sha256: None, ..probe.clone() }).await?;
            (p, o)
        }
    };
    let label = match output {
        Output::Stdout => id_of(&url),
        _ => shown.display().to_string(),
    };
    let write_error = |e: std::io::Error| match &output {
        Output::Stdout => stdout_error(&e),
        Output::Direct(p) | Output::Part(p) | Output::Verified(p) => {
            CliError::new(EXIT_FAILURE, format!("writing the download to {}: {e}", p.display()))
        }
    };
    let mut out = open(&output).await.map_err(write_error)?;
    let progress = Progress::new(&label, total.unwrap_or(0), 0, args.quiet);
    let (mut hasher, mut pos, mut digest, mut res) = (Sha256::new(), 0u64, probe.sha256.clone(), Some(res));
    let ended = loop {
        let answer = match res.take() {
            Some(r) => r,
            None => {
                let r = client.send_retrying(&mut retry, &what, || send(pos)).await?;
                match r.status().as_u16() {
                    206 if matches!(typed_header(r.headers(), "content-range"), Some(ContentRange::Bytes { first, .. }) if first == pos) => {}
                    200 if matches!(output, Output::Part(_)) => {
                        progress.note("the server sent the file from its start; starting over");
                        (hasher, pos) = (Sha256::new(), 0);
                        out = open(&output).await.map_err(write_error)?;
                        progress.set(0, false);
                    }
                    status => {
                        let body = r.text().await.unwrap_or_default();
                        break Err(CliError::from_status(&format!("{what} from byte {pos}"), status, &body));
                    }
                }
                digest = digest.or_else(|| repr_digest_sha256(r.headers()));
                r
            }
        };
        let mut body = http::Response::from(answer).into_body();
        let cut = loop {
            match body.frame().await {
                None => break None,
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(b) => {
                        out.write_all(&b).await.map_err(write_error)?;
                        hasher.update(&b);
                        pos += b.len() as u64;
                        progress.inc(b.len() as u64);
                        retry.success();
                    }
                    Err(frame) => {
                        if let Some(t) = frame.trailers_ref() {
                            digest = repr_digest_sha256(t).or(digest);
                        }
                    }
                },
                Some(Err(e)) => break Some(CliError::network(&format!("{what} at byte {pos}"), &e)),
            }
        };
        match cut {
            None => break Ok(()),
            Some(err) => retry.wait(err).await?,
        }
    };
    progress.finish();
    out.flush().await.map_err(write_error)?;
    let local = hex::encode(hasher.finalize());
    let verdict = ended.and_then(|()| match &digest {
        Some(server) if *server == local => Ok(()),
        Some(server) => Err(CliError::new(EXIT_VERIFY, format!("sha256 mismatch: received {local}, the server declares {server} for {url}"))),
        None => Err(CliError::new(
            EXIT_VERIFY,
            format!(
                "the download of {url} ended after {pos} bytes without the file's sha256 (no Repr-Digest trailer): \
                 the upload may have been abandoned, or a proxy dropped the trailer"
            ),
        )
        .hint("Check the file's status (ferry ls); once it is complete, download it again without --follow.")),
    });
    if let Err(e) = verdict {
        if let Output::Part(p) = &output {
            let _ = std::fs::remove_file(part_path(p));
        }
        return Err(e);
    }
    if let Output::Part(p) = &output {
        let f = std::fs::OpenOptions::new().write(true).open(part_path(p)).map_err(write_error)?;
        f.sync_all().map_err(write_error)?;
        drop(f);
        replace(&part_path(p), p)?;
    }
    if matches!(output, Output::Stdout) {
        return Ok(());
    }
    let done = Done { path: shown.display().to_string(), url: url.to_string(), size: pos, sha256: local, resumed_from: 0, received: pos };
    if args.json {
        print_line(&serde_json::to_string(&done).expect("serialises"))
    } else {
        print_line(&format!("{}\t{}", done.path, done.sha256))
    }
}

/// Where the bytes go, opened from its start (`PATH.part` created or truncated).
async fn open(output: &Output) -> std::io::Result<Box<dyn tokio::io::AsyncWrite + Unpin + Send>> {
    Ok(match output {
        Output::Stdout => Box::new(tokio::io::stdout()),
        Output::Direct(p) | Output::Verified(p) => Box::new(tokio::fs::OpenOptions::new().write(true).open(p).await?),
        Output::Part(p) => Box::new(tokio::fs::OpenOptions::new().create(true).write(true).truncate(true).open(part_path(p)).await?),
    })
}

//! Following an upload that is still arriving (issue 51): a reader gets the bytes committed so
//! far, then each new commit as it becomes durable, until the upload finishes — and then the
//! whole file's sha256, as checked at completion.
//!
//! Commits reach a follower two ways: this process's own checkpoints wake it at once
//! ([`Commits`], told by every commit of the offset in this module's engine), and every
//! [`FOLLOW_POLL`] it reads the catalog's row anyway, so a commit by another replica (the
//! catalog is shared) is seen within that interval. A follower never holds the writer's lease:
//! it never slows or stops a writer.
//!
//! A follow ends with an error — never a clean end that looks complete — when the upload is
//! terminated, expires (its `Upload-Expires` passes), is refused at completion (a declared
//! sha256 that does not match resets it to 0; a pre-finish hook removes it), goes back below
//! the bytes already sent (a roll-back), when its finished bytes are found damaged, when the
//! server shuts down, or when no byte was committed for [`FOLLOW_IDLE`] while uploads never
//! expire (`expire_after` off).
//!
//! What is sent is checked by the catalog's offsets, not hashed again: the final sha256 is the
//! one the upload engine checked at completion, and a client that compares it with what it
//! received (`ferry download --follow` does) detects anything a roll-back between two looks
//! could have mixed in.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use tokio::sync::watch;

use super::UploadEngine;
use crate::blob::{BlobError, ByteStream};
use crate::catalog::UploadRecord;

/// The longest a follower waits before reading the upload's row again without being woken
/// by a commit of this process: the bound on how late it sees a commit made on another replica.
pub const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// How long a follower waits for a new committed byte when uploads never expire
/// (`expire_after` off); otherwise the upload's own `Upload-Expires` bounds the wait.
pub const FOLLOW_IDLE: Duration = Duration::from_secs(24 * 3600);

/// How many roll-backs [`Commits`] remembers for its followers.
const REWINDS_KEPT: usize = 16;

/// What a follow yields: the upload's bytes in order, then its sha256 once finished.
#[derive(Debug, Clone)]
pub enum Followed {
    Bytes(Bytes),
    /// The upload finished and every byte asked for was sent: its sha256 (all of the file's
    /// bytes, whatever range was asked for), as the engine checked it at completion.
    Whole {
        sha256: [u8; 32],
    },
}

/// A follow's items; an `Err` ends it (the transport must then end its answer as a failure).
pub type FollowStream = Pin<Box<dyn Stream<Item = std::io::Result<Followed>> + Send>>;

/// What this process committed of one upload, as its followers see it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Commit {
    /// The last offset committed (`None` until the first commit seen).
    offset: Option<u64>,
    /// How many times a commit went back below the one before, and to where (the last
    /// [`REWINDS_KEPT`]: `(number, offset)`).
    rewinds: u64,
    rewound_to: Vec<(u64, u64)>,
}

/// Commits of this process, by upload id, for the uploads someone follows (an entry lives
/// while a follower watches it). Telling a commit nobody follows is one map look-up.
#[derive(Default)]
pub(crate) struct Commits(Mutex<HashMap<String, watch::Sender<Commit>>>);

impl Commits {
    /// Upload `id`'s offset is now `offset` (committed: durable and in the catalog), or its
    /// row changed otherwise (`None`: deleted, tombstoned) — wake its followers.
    pub(crate) fn tell(&self, id: &str, offset: Option<u64>) {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = map.get(id) else { return };
        tx.send_modify(|c| {
            if let (Some(now), Some(before)) = (offset, c.offset) {
                if now < before {
                    c.rewinds += 1;
                    c.rewound_to.push((c.rewinds, now));
                    if c.rewound_to.len() > REWINDS_KEPT {
                        c.rewound_to.remove(0);
                    }
                }
            }
            if offset.is_some() {
                c.offset = offset;
            }
        });
    }

    fn watch(&self, id: &str) -> watch::Receiver<Commit> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(id.to_string()).or_insert_with(|| watch::Sender::new(Commit::default())).subscribe()
    }

    /// Forget `id` once nobody watches it.
    fn unwatched(&self, id: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(id).is_some_and(|tx| tx.receiver_count() == 0) {
            map.remove(id);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Why a follow ended without the whole file (for the log; the client sees its answer cut).
fn ended(why: impl Into<String>) -> std::io::Error {
    std::io::Error::other(why.into())
}

struct Follower {
    engine: Arc<UploadEngine>,
    principal: String,
    id: String,
    /// The next byte to send (absolute), and where to stop (exclusive; `None`: the file's end).
    sent: u64,
    end: Option<u64>,
    reading: Option<ByteStream>,
    commits: Option<watch::Receiver<Commit>>,
    /// The roll-backs already looked at ([`Commit::rewinds`]).
    rewinds_seen: u64,
    /// The highest offset seen, and when it last grew.
    offset_seen: u64,
    grew_at: Instant,
    done: bool,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.commits = None;
        self.engine.commits.unwatched(&self.id);
    }
}

impl UploadEngine {
    /// Follow upload `rec` of `principal` (as [`UploadEngine::get`] read it, unfinished or
    /// not) from byte `start` to `end` (exclusive; `None`: to the file's end, once known): the
    /// bytes committed so far, then each commit, then [`Followed::Whole`] once it finished.
    /// Never takes the writer's lease. An unfinished upload's bytes are read only from a
    /// store that can ([`crate::blob::BlobStore::reads_unfinished`]); otherwise (S3, whose
    /// parts cannot be read before the multipart upload completes) the follow waits for the
    /// completion and then streams. Ends with an error as the module says.
    pub fn follow(self: &Arc<Self>, rec: &UploadRecord, start: u64, end: Option<u64>) -> FollowStream {
        let commits = self.commits.watch(&rec.id);
        let rewinds_seen = commits.borrow().rewinds;
        let f = Follower {
            engine: self.clone(),
            principal: rec.principal.clone(),
            id: rec.id.clone(),
            sent: start,
            end,
            reading: None,
            commits: Some(commits),
            rewinds_seen,
            offset_seen: rec.offset,
            grew_at: Instant::now(),
            done: false,
        };
        Box::pin(futures::stream::unfold(f, |mut f| async move {
            if f.done {
                return None;
            }
            let item = f.step().await;
            f.done = !matches!(item, Ok(Followed::Bytes(_)));
            Some((item, f))
        }))
    }
}

impl Follower {
    async fn step(&mut self) -> std::io::Result<Followed> {
        loop {
            if let Some(reading) = self.reading.as_mut() {
                match reading.next().await {
                    Some(Ok(chunk)) => {
                        self.sent += chunk.len() as u64;
                        return Ok(Followed::Bytes(chunk));
                    }
                    Some(Err(e)) => return Err(ended(format!("reading the upload's bytes failed: {}", BlobError::from_stream(e)))),
                    None => self.reading = None,
                }
            }
            self.check_rewinds()?;
            let rec = self.engine.get(&self.principal, &self.id).await.map_err(|e| ended(format!("the upload is gone: {}", e.detail)))?;
            if rec.offset < self.sent || rec.length.is_some_and(|l| l < self.sent) {
                return Err(ended(format!("the upload went back to {} bytes, below the {} already sent", rec.offset, self.sent)));
            }
            if rec.offset > self.offset_seen {
                self.offset_seen = rec.offset;
                self.grew_at = Instant::now();
            }
            if let Some(sha256) = rec.sha256.filter(|_| rec.is_finished()) {
                let len = rec.length.unwrap_or(rec.offset);
                let end = self.end.map_or(len, |e| e.min(len));
                if self.sent >= end {
                    return Ok(Followed::Whole { sha256 });
                }
                self.reading = Some(self.engine.read(&rec, self.sent..end).await.map_err(|e| ended(e.detail))?);
                continue;
            }
            let ready = self.end.map_or(rec.offset, |e| e.min(rec.offset));
            if ready > self.sent && self.engine.blobs.reads_unfinished() {
                self.reading = Some(self.engine.blobs.read(&rec.id, self.sent..ready).await.map_err(|e| ended(e.to_string()))?);
                continue;
            }
            self.wait(&rec).await?;
        }
    }

    /// An error when this process rolled the upload back below the bytes already sent since
    /// the follow began (a declared sha256 that did not match resets it to 0).
    fn check_rewinds(&mut self) -> std::io::Result<()> {
        let Some(commits) = self.commits.as_ref() else { return Ok(()) };
        let c = commits.borrow();
        if c.rewinds == self.rewinds_seen {
            return Ok(());
        }
        let missed = c.rewound_to.first().is_none_or(|(n, _)| *n > self.rewinds_seen + 1);
        let below = c.rewound_to.iter().filter(|(n, _)| *n > self.rewinds_seen).any(|(_, to)| *to < self.sent);
        if missed || below {
            return Err(ended(format!("the upload went back below the {} bytes already sent", self.sent)));
        }
        self.rewinds_seen = c.rewinds;
        Ok(())
    }

    /// Wait for a commit of this process, at most [`FOLLOW_POLL`]; an error at shutdown, or
    /// once the upload has been idle too long (uploads that never expire).
    async fn wait(&mut self, rec: &UploadRecord) -> std::io::Result<()> {
        if self.engine.cfg.expire_after.is_none() && self.grew_at.elapsed() >= FOLLOW_IDLE {
            return Err(ended(format!("no byte of the upload was committed for {}", humantime::format_duration(FOLLOW_IDLE))));
        }
        // An upload with every byte stored waits for the finisher; a reader may finish it
        // (never stopping a writer), as a plain download would.
        if super::finishing::awaits_finish(rec) {
            let _ = self.engine.get_finished_or_finish(&self.principal, &self.id).await;
        }
        let shutdown = self.engine.shutdown.clone();
        let commits = self.commits.as_mut().expect("watching until dropped");
        tokio::select! {
            changed = commits.changed() => {
                if changed.is_err() {
                    tokio::time::sleep(FOLLOW_POLL).await;
                }
            }
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
            _ = shutdown.cancelled() => return Err(ended("the server is shutting down: resume with a Range from the bytes received")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_count_rewinds_and_forget_the_unwatched() {
        let c = Commits::default();
        c.tell("a", Some(5)); // nobody watches: nothing kept
        assert_eq!(c.len(), 0);
        let rx = c.watch("a");
        c.tell("a", Some(10));
        c.tell("a", Some(20));
        assert_eq!(rx.borrow().rewinds, 0);
        c.tell("a", Some(0));
        c.tell("a", None);
        let seen = rx.borrow().clone();
        assert_eq!((seen.offset, seen.rewinds, seen.rewound_to.clone()), (Some(0), 1, vec![(1, 0)]));
        drop(rx);
        c.unwatched("a");
        assert_eq!(c.len(), 0);
    }
}

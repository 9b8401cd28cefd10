//! The S3 part model and the blob state that records it (DESIGN §2 "S3 mapping").
//!
//! An upload's bytes are cut into parts by a [`Schedule`] that is a pure function of the offset
//! and is recorded in the state, so every holder of the upload cuts it the same way:
//!
//! - [`Schedule::Fixed`] (every upload created since round 3): one part size, fixed when the
//!   first writer opens the blob, from the upload's length (or the largest size a
//!   deferred-length upload may reach) so that [`PART_SLOTS`] parts hold it, never below the
//!   store's floor. Every part but the last has that size: what every S3-compatible store
//!   accepts (Cloudflare R2 refuses CompleteMultipartUpload otherwise).
//! - [`Schedule::Doubling`] (version 2): 5 MiB parts doubling every 1 000; read so that uploads
//!   begun before round 3 still resume and finish.
//!
//! **A part number is sent once** (version 5, [`Numbering`]). An UploadPart whose outcome is
//! unknown — cut by a deadline, dropped when its writer let go, a streamed part given up —
//! may still be on its way and reach S3 later, and S3 keeps the *last* upload of a part
//! number (Garage even as soon as its first block arrives, a part that then fails included):
//! had anyone uploaded that number again, the late one would replace it and the completion
//! would fail (`InvalidPart`) or hold the wrong bytes. So every attempt at a part takes a
//! number never used before in the multipart upload: the state keeps the next unused one,
//! the numbers a writer took are committed every few ([`UNNOTED_NUMBERS`]) and when it fails
//! ([`super::super::BlobWriter::amend`]), so a writer that took the upload over from holders
//! that never let go skips a small window of numbers per such holder ([`STALE_WINDOW`],
//! recorded with the numbering), past whatever they may have sent unrecorded. The numbers S3
//! has beyond an upload's parts pay for it, shared with the spare number each streamed part
//! keeps for its resend: ≈ 300 such takeovers for an upload of a few hundred parts, 8 near
//! [`PART_SLOTS`] parts (whose last parts go unstreamed to keep them). When they run short the numbers stay within S3's 10 000 by
//! leaving room for the parts still to come ([`Numbering::take`]), a number may then be sent
//! again, and the writer says so in the log.
//! States of versions 3 and 4 number part `i` `2i + 1 + (generation mod 2)` ([`part_number`]):
//! uploads begun with them finish that way.
//!
//! The state (version 5; 4 held the same without the numbering, 3 inline) holds the schedule,
//! the multipart id, the numbering, each uploaded part's number and `PartId.content_id`
//! (verbatim) — as the entries of a framed state ([`BlobState::framed`]), which the catalog
//! keeps beside the upload's row — and the tail segments — bytes of the open part made durable
//! at checkpoints, each an object named by its range and by the fence of the writer that wrote
//! it, so two writers of one upload (a paused one that lost its lease and the one that took
//! over) never write the same key.

use super::super::{BlobError, BlobResult, BlobState};

/// S3's smallest part but the last: 5 MiB.
pub const MIN_PART: u64 = 5 * MIB;
/// S3's largest part: 5 GiB.
pub const MAX_PART: u64 = 5 << 30;
/// S3's largest part number.
pub const MAX_PARTS: u64 = 10_000;
/// Most parts of one upload: half of S3's part numbers, so the other half is left for parts
/// sent again ([`Numbering`]; versions 3 and 4: two numbers per part, [`part_number`]).
pub const PART_SLOTS: u64 = MAX_PARTS / 2;
/// Part numbers a writer may have taken that no commit records yet, at most: it asks for them
/// to be recorded ([`crate::blob::BlobWriter::wants_numbers_noted`]) once it holds this many,
/// and one write adds at most a few more (a part and its stream's two numbers).
pub const UNNOTED_NUMBERS: u32 = 8;

/// Part numbers a writer that took an upload over skips for each holder before it that never
/// let go ([`Numbering::open`]): twice what a writer may have taken unrecorded
/// ([`UNNOTED_NUMBERS`] and the numbers of one more write).
pub const STALE_WINDOW: u32 = 32;

/// The default floor of [`fixed_part_size`]: 16 MiB (one request per 16 MiB on S3; measured in
/// benches/RESULTS.md against 5 MiB and 64 MiB).
pub const DEFAULT_PART_FLOOR: u64 = 16 * MIB;
pub(crate) const MIB: u64 = 1024 * 1024;
/// Parts of one size before a [`Schedule::Doubling`] size doubles.
const PARTS_PER_STEP: u64 = 1_000;

/// The part size of an upload that holds at most `hint` bytes (0: unknown): the smallest whole
/// number of MiB such that [`PART_SLOTS`] parts hold `hint`, never below `floor` (the server's
/// `[s3] part_size`, which the configuration keeps within [`MIN_PART`]..=[`MAX_PART`]; tests
/// against a store that allows smaller parts use less) and never above [`MAX_PART`]. E.g.
/// floor 16 MiB: 16 MiB up to 78 GiB; 1 TiB → 210 MiB; 5 TiB → 1 049 MiB.
pub fn fixed_part_size(hint: u64, floor: u64) -> u64 {
    let need = hint.div_ceil(PART_SLOTS).div_ceil(MIB).saturating_mul(MIB);
    need.max(floor).clamp(1, MAX_PART)
}

/// Size in bytes of part `idx` (0-based) of a version-2 schedule with base `base`:
/// `base * 2^(idx / 1000)`.
pub fn part_size(base: u64, idx: u64) -> u64 {
    base << (idx / PARTS_PER_STEP).min(20)
}

/// Where part `idx` of a version-2 schedule starts, in bytes.
pub fn part_start(base: u64, idx: u64) -> u64 {
    let step = idx / PARTS_PER_STEP;
    PARTS_PER_STEP * base * ((1u64 << step) - 1) + (idx % PARTS_PER_STEP) * part_size(base, idx)
}

/// The S3 part number (1-based) of part `idx` (0-based) of a version 2–4 state, uploaded under
/// `schedule` by a writer of `generation` ([`crate::blob::WriteLease::generation`]):
/// `2 idx + 1 + (generation mod 2)` for fixed parts; `idx + 1` for version 2 (whose states
/// predate two numbers per part). Version 5 states number parts by [`Numbering`].
pub(crate) fn part_number(schedule: Schedule, idx: u64, generation: u64) -> u32 {
    match schedule {
        Schedule::Fixed(_) => (2 * idx + 1 + (generation & 1)) as u32,
        Schedule::Doubling(_) => (idx + 1) as u32,
    }
}

/// How an upload is cut into parts (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schedule {
    /// Version 2: `base * 2^(idx / 1000)`.
    Doubling(u64),
    /// Version 3: every part this many bytes but the last.
    Fixed(u64),
}

impl Schedule {
    /// Size in bytes of part `idx`.
    pub(crate) fn size(self, idx: u64) -> u64 {
        match self {
            Schedule::Doubling(base) => part_size(base, idx),
            Schedule::Fixed(size) => size,
        }
    }

    /// Where part `idx` starts, in bytes.
    pub(crate) fn start(self, idx: u64) -> u64 {
        match self {
            Schedule::Doubling(base) => part_start(base, idx),
            Schedule::Fixed(size) => size.saturating_mul(idx),
        }
    }

    /// The part byte `offset` falls in.
    pub(crate) fn part_of(self, offset: u64) -> u64 {
        match self {
            Schedule::Fixed(size) => offset / size,
            Schedule::Doubling(_) => {
                let mut idx = 0;
                while self.start(idx + 1) <= offset {
                    idx += 1;
                }
                idx
            }
        }
    }
}

/// How a version-5 state numbers parts (see the module docs): every number below `next` may
/// have been sent by some writer of the multipart upload; `generation` is that of the writer
/// that committed it ([`crate::blob::WriteLease::generation`]); `window` is what a taker skips
/// per holder that never let go ([`STALE_WINDOW`] for every state written so far).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Numbering {
    pub next: u32,
    pub generation: u64,
    pub window: u32,
}

impl Numbering {
    /// The numbering of a fresh multipart upload whose takers skip `window` numbers per stale
    /// holder ([`STALE_WINDOW`]).
    pub(crate) fn new(window: u32) -> Numbering {
        Numbering { next: 1, generation: 0, window }
    }

    /// The numbering a writer of `generation` starts from: past a window for each holder since
    /// this state's writer that lost its lease without letting go (each may have sent parts
    /// after its last commit, and may still have some on their way).
    pub(crate) fn open(self, generation: u64) -> Numbering {
        let behind = generation.saturating_sub(self.generation);
        let skip = u32::try_from(behind.saturating_mul(u64::from(self.window))).unwrap_or(u32::MAX);
        let next = self.next.saturating_add(skip).min(MAX_PARTS as u32 + 1);
        Numbering { next, generation: generation.max(self.generation), window: self.window }
    }

    /// The number for the next attempt at part `idx` of an upload of at most `most_parts`
    /// parts, after the part before it numbered `after` (0: none). Normally `next`; never past
    /// the room the parts still to come need in S3's 10 000 (numbers may then be used again:
    /// the protection above wears thin only after many takeovers), and always above `after`.
    /// Also says whether the number was held back so (it may have been sent before). `None`
    /// when S3's 10 000 numbers cannot hold the part.
    pub(crate) fn take(&mut self, idx: u64, most_parts: u64, after: u32) -> Option<(u32, bool)> {
        let to_come = most_parts.max(idx + 1).min(MAX_PARTS).saturating_sub(idx + 1);
        let room = MAX_PARTS.saturating_sub(to_come) as u32;
        let n = self.next.min(room).max(after + 1).max(1);
        if u64::from(n) > MAX_PARTS {
            return None;
        }
        let held_back = n < self.next;
        self.next = self.next.max(n + 1);
        Some((n, held_back))
    }
}

/// One tail segment: bytes `start..end` of part `part`, written by the writer with fence
/// `fence` (`None`: a version-2 segment, named without a fence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Segment {
    pub part: u64,
    pub start: u64,
    pub end: u64,
    pub fence: Option<u64>,
}

impl Segment {
    pub(crate) fn len(&self) -> u64 {
        self.end - self.start
    }

    /// The object name under `<id>.tail/`.
    pub(crate) fn name(&self) -> String {
        match self.fence {
            Some(f) => format!("{}-{}-{}.{f}", self.part, self.start, self.end),
            None => format!("{}-{}-{}", self.part, self.start, self.end),
        }
    }
}

/// The S3 store's blob state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct S3State {
    pub schedule: Schedule,
    pub multipart: Option<String>,
    /// The uploaded parts in order, as `(part number, content id)` (part `i` has
    /// `schedule.size(i)` bytes).
    pub parts: Vec<(u32, String)>,
    /// Tail segments, in order: `(fence, end)`; the first starts where the parts end.
    pub tail: Vec<(Option<u64>, u64)>,
    /// Version 5; `None` for states of versions 2–4, numbered by [`part_number`].
    pub numbering: Option<Numbering>,
}

/// The version-3 byte that stands for "no fence" (a version-2 segment).
const NO_FENCE: u64 = u64::MAX;

impl S3State {
    /// The state of a blob with no part yet, cut by `schedule`, numbered by `numbering`.
    pub(crate) fn new(schedule: Schedule, numbering: Numbering) -> S3State {
        S3State { schedule, multipart: None, parts: Vec::new(), tail: Vec::new(), numbering: Some(numbering) }
    }

    /// Ready the numbering for a writer of `generation` ([`Numbering::open`]). Numbers count
    /// within one multipart upload: before there is one, no stale writer's part can collide
    /// with this writer's (a multipart upload a writer created without committing it is never
    /// completed), so the numbering starts afresh under this generation.
    pub(crate) fn open_numbering(&mut self, generation: u64) {
        let fresh = self.multipart.is_none();
        self.numbering = self.numbering.map(|n| if fresh { Numbering { generation, ..Numbering::new(n.window) } } else { n.open(generation) });
    }

    /// A new blob in fixed parts of `size` bytes.
    pub(crate) fn fixed(size: u64) -> S3State {
        S3State::new(Schedule::Fixed(size), Numbering::new(STALE_WINDOW))
    }

    pub(crate) fn parts_end(&self) -> u64 {
        self.schedule.start(self.parts.len() as u64)
    }

    pub(crate) fn offset(&self) -> u64 {
        self.tail.last().map_or_else(|| self.parts_end(), |t| t.1)
    }

    /// Size of the part being filled.
    pub(crate) fn open_part_size(&self) -> u64 {
        self.schedule.size(self.parts.len() as u64)
    }

    pub(crate) fn segments(&self) -> Vec<Segment> {
        let mut start = self.parts_end();
        let part = self.parts.len() as u64;
        self.tail
            .iter()
            .map(|&(fence, end)| {
                let s = Segment { part, start, end, fence };
                start = end;
                s
            })
            .collect()
    }

    /// Version 5 (4 without a numbering), framed ([`BlobState::framed`]): the head holds the
    /// schedule, the multipart id, the numbering (`next` u32 LE, `generation` u64 LE, `window`
    /// u32 LE; version 5 only) and the tail; each uploaded part is an entry (`number` u32 LE, then its content
    /// id), so the catalog keeps the part list beside the upload's row and a checkpoint
    /// appends the parts it added.
    pub(crate) fn encode(&self) -> BlobState {
        let mut head = vec![if self.numbering.is_some() { 5u8 } else { 4u8 }];
        let (tag, size) = match self.schedule {
            Schedule::Doubling(b) => (0u8, b),
            Schedule::Fixed(s) => (1u8, s),
        };
        head.push(tag);
        head.extend_from_slice(&size.to_le_bytes());
        put_str(&mut head, self.multipart.as_deref().unwrap_or(""));
        if let Some(n) = self.numbering {
            head.extend_from_slice(&n.next.to_le_bytes());
            head.extend_from_slice(&n.generation.to_le_bytes());
            head.extend_from_slice(&n.window.to_le_bytes());
        }
        head.extend_from_slice(&(self.tail.len() as u32).to_le_bytes());
        for (fence, end) in &self.tail {
            head.extend_from_slice(&fence.unwrap_or(NO_FENCE).to_le_bytes());
            head.extend_from_slice(&end.to_le_bytes());
        }
        let parts: Vec<Vec<u8>> = self
            .parts
            .iter()
            .map(|(number, cid)| {
                let mut e = Vec::with_capacity(4 + cid.len());
                e.extend_from_slice(&number.to_le_bytes());
                e.extend_from_slice(cid.as_bytes());
                e
            })
            .collect();
        BlobState::framed(&head, &parts)
    }

    /// Decode and check a state: `None` for the empty state, `BadState` for anything this
    /// store did not write or that breaks its schedule, or a row read without its entries
    /// ([`BlobState::lacks_entries`]). Reads versions 2 to 5.
    pub(crate) fn decode(state: &BlobState) -> BlobResult<Option<S3State>> {
        let b = state.as_bytes();
        if b.is_empty() {
            return Ok(None);
        }
        if let Some((head, entries)) = state.unframe()? {
            return Self::checked(Self::decode_framed(head, &entries)?).map(Some);
        }
        let mut r = Reader(b);
        let s = match r.take(1)?[0] {
            2 => {
                let base = r.u64()?;
                let mp = r.string()?;
                let n = r.u32()? as u64;
                let mut parts = Vec::with_capacity(n.min(MAX_PARTS) as usize);
                for i in 0..n {
                    let size = r.u64()?;
                    if i >= MAX_PARTS || size != part_size(base, i) {
                        return Err(BlobError::BadState);
                    }
                    parts.push(((i + 1) as u32, r.string()?));
                }
                let nt = r.u32()?;
                let mut tail = Vec::new();
                for _ in 0..nt {
                    tail.push((None, r.u64()?));
                }
                if base == 0 {
                    return Err(BlobError::BadState);
                }
                S3State { schedule: Schedule::Doubling(base), multipart: (!mp.is_empty()).then_some(mp), parts, tail, numbering: None }
            }
            3 => {
                let tag = r.take(1)?[0];
                let size = r.u64()?;
                let schedule = Self::schedule(tag, size)?;
                let mp = r.string()?;
                let n = r.u32()? as u64;
                if n > MAX_PARTS {
                    return Err(BlobError::BadState);
                }
                let mut parts: Vec<(u32, String)> = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let number = r.u32()?;
                    Self::check_number(&parts, number)?;
                    parts.push((number, r.string()?));
                }
                let tail = Self::read_tail(&mut r)?;
                S3State { schedule, multipart: (!mp.is_empty()).then_some(mp), parts, tail, numbering: None }
            }
            _ => return Err(BlobError::BadState),
        };
        if !r.0.is_empty() {
            return Err(BlobError::BadState);
        }
        Self::checked(s).map(Some)
    }

    /// Versions 4 and 5.
    fn decode_framed(head: &[u8], entries: &[&[u8]]) -> BlobResult<S3State> {
        let mut r = Reader(head);
        let version = r.take(1)?[0];
        if !matches!(version, 4 | 5) {
            return Err(BlobError::BadState);
        }
        let tag = r.take(1)?[0];
        let size = r.u64()?;
        let schedule = Self::schedule(tag, size)?;
        let mp = r.string()?;
        let numbering = if version == 5 { Some(Numbering { next: r.u32()?, generation: r.u64()?, window: r.u32()? }) } else { None };
        let tail = Self::read_tail(&mut r)?;
        if !r.0.is_empty() || entries.len() as u64 > MAX_PARTS {
            return Err(BlobError::BadState);
        }
        let mut parts: Vec<(u32, String)> = Vec::with_capacity(entries.len());
        for e in entries {
            let (number, cid) = e.split_first_chunk::<4>().ok_or(BlobError::BadState)?;
            let number = u32::from_le_bytes(*number);
            Self::check_number(&parts, number)?;
            parts.push((number, String::from_utf8(cid.to_vec()).map_err(|_| BlobError::BadState)?));
        }
        if numbering.is_some_and(|n| parts.last().is_some_and(|p| p.0 >= n.next)) {
            // Every number a part has was taken from the numbering.
            return Err(BlobError::BadState);
        }
        Ok(S3State { schedule, multipart: (!mp.is_empty()).then_some(mp), parts, tail, numbering })
    }

    fn schedule(tag: u8, size: u64) -> BlobResult<Schedule> {
        match tag {
            0 if size > 0 => Ok(Schedule::Doubling(size)),
            1 if (1..=MAX_PART).contains(&size) => Ok(Schedule::Fixed(size)),
            _ => Err(BlobError::BadState),
        }
    }

    /// Part numbers ascend, within S3's 1..=10 000.
    fn check_number(parts: &[(u32, String)], number: u32) -> BlobResult<()> {
        if number == 0 || u64::from(number) > MAX_PARTS || parts.last().is_some_and(|p| p.0 >= number) {
            return Err(BlobError::BadState);
        }
        Ok(())
    }

    fn read_tail(r: &mut Reader<'_>) -> BlobResult<Vec<(Option<u64>, u64)>> {
        let nt = r.u32()?;
        let mut tail = Vec::new();
        for _ in 0..nt {
            let fence = r.u64()?;
            tail.push(((fence != NO_FENCE).then_some(fence), r.u64()?));
        }
        Ok(tail)
    }

    /// The rules every version keeps: parts only under a multipart upload, tail segments
    /// ascending inside the open part.
    fn checked(s: S3State) -> BlobResult<S3State> {
        if s.multipart.is_none() && !s.parts.is_empty() {
            return Err(BlobError::BadState);
        }
        let (parts_end, size) = (s.parts_end(), s.open_part_size());
        let mut prev = parts_end;
        for &(_, end) in &s.tail {
            if end <= prev || end - parts_end >= size {
                return Err(BlobError::BadState);
            }
            prev = end;
        }
        Ok(s)
    }
}

fn put_str(v: &mut Vec<u8>, s: &str) {
    v.extend_from_slice(&(s.len() as u32).to_le_bytes());
    v.extend_from_slice(s.as_bytes());
}

struct Reader<'a>(&'a [u8]);
impl Reader<'_> {
    fn take(&mut self, n: usize) -> BlobResult<&[u8]> {
        if self.0.len() < n {
            return Err(BlobError::BadState);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> BlobResult<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> BlobResult<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn string(&mut self) -> BlobResult<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| BlobError::BadState)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_parts_hold_any_upload_in_ten_thousand_parts() {
        let floor = DEFAULT_PART_FLOOR;
        assert_eq!(fixed_part_size(0, floor), floor, "unknown size: the floor");
        assert_eq!(fixed_part_size(10 << 30, floor), floor);
        assert_eq!(fixed_part_size(1 << 40, floor), 210 * MIB, "1 TiB");
        assert_eq!(fixed_part_size(5 << 40, floor), 1049 * MIB, "5 TiB, S3's largest object");
        assert_eq!(fixed_part_size(u64::MAX, floor), MAX_PART);
        assert_eq!(fixed_part_size(1, MIB), MIB, "a test store's smaller floor");
        for hint in [1u64, MIB, 78 << 30, 79 << 30, 1 << 40, 3 << 40, 5 << 40] {
            let size = fixed_part_size(hint, floor);
            assert!(size * PART_SLOTS >= hint, "{hint}");
            assert_eq!(size % MIB, 0);
        }
    }

    #[test]
    fn a_part_has_two_numbers_and_writers_of_adjacent_generations_never_share_one() {
        let s = Schedule::Fixed(16 * MIB);
        assert_eq!((part_number(s, 0, 4), part_number(s, 0, 5)), (1, 2));
        assert_eq!(part_number(s, PART_SLOTS - 1, 7), MAX_PARTS as u32, "the last part's second number is S3's last");
        for idx in 0..100 {
            assert_ne!(part_number(s, idx, 10), part_number(s, idx, 11));
            assert!(part_number(s, idx, 11) < part_number(s, idx + 1, 10), "ascending with the part whatever the fences");
        }
        assert_eq!(part_number(Schedule::Doubling(MIN_PART), 3, 9), 4, "version 2: idx + 1");
    }

    #[test]
    fn every_attempt_at_a_part_takes_a_number_never_sent_before() {
        let mut n = Numbering::new(STALE_WINDOW);
        // Part 0, its stream given up and sent whole; part 1 sent once.
        assert_eq!((n.take(0, 64, 0), n.take(0, 64, 0), n.take(1, 64, 2)), (Some((1, false)), Some((2, false)), Some((3, false))));
        assert_eq!(n.next, 4);
        // A writer of the same generation goes on from the committed numbering.
        assert_eq!(n.open(0), n);
        // Two holders that never let go since: two windows skipped, the generation recorded.
        let taker = n.open(2);
        assert_eq!(taker, Numbering { next: 4 + 2 * STALE_WINDOW, generation: 2, window: STALE_WINDOW });
        // An older writer's view never moves the numbering back.
        assert_eq!(taker.open(1), taker);
    }

    #[test]
    fn a_writer_before_the_multipart_upload_exists_skips_nothing() {
        let mut st = S3State::fixed(16 * MIB);
        st.open_numbering(7);
        assert_eq!(st.numbering, Some(Numbering { next: 1, generation: 7, window: STALE_WINDOW }));
        st.multipart = Some("m".into());
        st.open_numbering(8);
        assert_eq!(st.numbering.map(|n| n.next), Some(1 + STALE_WINDOW), "one holder since never let go");
    }

    #[test]
    fn numbers_stay_within_ten_thousand_and_ascending_when_windows_run_short() {
        // Many takeovers: the next number is past what the parts still to come allow.
        let mut n = Numbering::new(500).open(30);
        assert_eq!(n.next, MAX_PARTS as u32 + 1);
        // 5 000 parts: part 0 may take at most 5 001, leaving 4 999 for the rest; the last
        // part takes S3's last number.
        assert_eq!(n.take(0, PART_SLOTS, 0), Some((5_001, true)), "held back: it may have been sent");
        assert_eq!(n.take(1, PART_SLOTS, 5_001), Some((5_002, true)));
        assert_eq!(n.take(PART_SLOTS - 1, PART_SLOTS, 9_999), Some((MAX_PARTS as u32, true)));
        // Always above the part before, and never past S3's last number.
        let mut m = Numbering { next: 3, ..Numbering::new(100) };
        assert_eq!(m.take(5, 10, 40), Some((41, false)));
        assert_eq!(m.take(9_999, MAX_PARTS, MAX_PARTS as u32), None);
    }

    #[test]
    fn doubling_schedule_of_version_two_is_kept() {
        let tib = 1u64 << 40;
        let s = Schedule::Doubling(MIN_PART);
        assert_eq!(s.part_of(tib - 1) + 1, 7_647, "1 TiB needed 7 647 parts");
        let mut sum = 0;
        for idx in 0..MAX_PARTS {
            assert_eq!(s.start(idx), sum);
            sum += s.size(idx);
        }
        assert_eq!(Schedule::Fixed(MIN_PART).part_of(MIN_PART), 1);
        assert_eq!(s.part_of(s.start(1500)), 1500);
    }

    #[test]
    fn state_round_trips_and_rejects_foreign_states() {
        let sched = Schedule::Fixed(16 * MIB);
        let st = S3State {
            schedule: sched,
            multipart: Some("abc/def+==".into()),
            parts: vec![(2, "\"etag1\"".into())],
            tail: vec![(Some(7), 16 * MIB + 3), (None, 16 * MIB + 10)],
            numbering: Some(Numbering { next: 9, generation: 3, window: 100 }),
        };
        assert_eq!(S3State::decode(&st.encode()).unwrap(), Some(st.clone()));
        let v4 = S3State { numbering: None, ..st.clone() };
        assert_eq!(S3State::decode(&v4.encode()).unwrap(), Some(v4), "a version-4 state stays one");
        let numbered_past_next = S3State { numbering: Some(Numbering { next: 2, generation: 3, window: 100 }), ..st.clone() };
        assert!(matches!(S3State::decode(&numbered_past_next.encode()), Err(BlobError::BadState)), "a part numbered past the numbering");
        assert_eq!(st.offset(), 16 * MIB + 10);
        assert_eq!(st.segments()[0].name(), format!("1-{}-{}.7", 16 * MIB, 16 * MIB + 3));
        assert_eq!(S3State::decode(&BlobState::default()).unwrap(), None);
        assert!(matches!(S3State::decode(&BlobState::fs(5)), Err(BlobError::BadState)));
        let mut bad = st.encode().0;
        bad.push(0);
        assert!(matches!(S3State::decode(&BlobState(bad)), Err(BlobError::BadState)));
        let tail_fills_part = S3State { tail: vec![(Some(1), 32 * MIB)], ..st.clone() };
        assert!(matches!(S3State::decode(&tail_fills_part.encode()), Err(BlobError::BadState)));
        let too_large = S3State { schedule: Schedule::Fixed(MAX_PART + 1), ..st };
        assert!(matches!(S3State::decode(&too_large.encode()), Err(BlobError::BadState)));
    }

    #[test]
    fn version_two_states_still_decode() {
        // base 5 MiB, multipart "m", one part of 5 MiB "e", tail ends [5 MiB + 3].
        let mut v = vec![2u8];
        v.extend_from_slice(&MIN_PART.to_le_bytes());
        put_str(&mut v, "m");
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&MIN_PART.to_le_bytes());
        put_str(&mut v, "e");
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&(MIN_PART + 3).to_le_bytes());
        let st = S3State::decode(&BlobState(v)).unwrap().unwrap();
        assert_eq!(
            st,
            S3State {
                schedule: Schedule::Doubling(MIN_PART),
                multipart: Some("m".into()),
                parts: vec![(1, "e".into())],
                tail: vec![(None, MIN_PART + 3)],
                numbering: None
            }
        );
        assert_eq!(st.segments()[0].name(), format!("1-{MIN_PART}-{}", MIN_PART + 3), "version-2 keys have no fence");
        // Re-encoded as version 4 and back, unchanged.
        assert_eq!(S3State::decode(&st.encode()).unwrap(), Some(st));
    }

    #[test]
    fn version_three_states_still_decode() {
        // Fixed 16 MiB, multipart "m", parts 2 "e1" and 4 "e2", one tail segment of fence 7.
        let mut v = vec![3u8, 1];
        v.extend_from_slice(&(16 * MIB).to_le_bytes());
        put_str(&mut v, "m");
        v.extend_from_slice(&2u32.to_le_bytes());
        for (n, e) in [(2u32, "e1"), (4, "e2")] {
            v.extend_from_slice(&n.to_le_bytes());
            put_str(&mut v, e);
        }
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&7u64.to_le_bytes());
        v.extend_from_slice(&(32 * MIB + 5).to_le_bytes());
        let st = S3State::decode(&BlobState(v)).unwrap().unwrap();
        let want = S3State {
            schedule: Schedule::Fixed(16 * MIB),
            multipart: Some("m".into()),
            parts: vec![(2, "e1".into()), (4, "e2".into())],
            tail: vec![(Some(7), 32 * MIB + 5)],
            numbering: None,
        };
        assert_eq!(st, want);
        assert_eq!(S3State::decode(&st.encode()).unwrap(), Some(want));
    }

    #[test]
    fn the_part_list_is_kept_beside_the_row_and_a_checkpoint_appends_to_it() {
        let mut st = S3State { multipart: Some("m".into()), parts: vec![(1, "e1".into())], ..S3State::fixed(16 * MIB) };
        st.numbering = Some(Numbering { next: 5, ..Numbering::new(100) });
        let one = st.encode();
        st.parts.push((4, "e2".into()));
        st.tail.push((Some(3), 32 * MIB + 9));
        let two = st.encode();
        // The row keeps no part; it grows with neither parts nor their content ids.
        assert_eq!(one.row().len(), two.row().len() - 16, "only the tail segment adds to the row");
        // A numbering moved on (a failed writer's, [`crate::blob::BlobWriter::amend`]) changes the row only.
        let mut moved = st.clone();
        moved.numbering = Some(Numbering { next: 7, ..Numbering::new(100) });
        assert_eq!(moved.encode().entries_from(&two), None);
        assert!(BlobState(two.row().to_vec()).lacks_entries());
        assert!(matches!(S3State::decode(&BlobState(two.row().to_vec())), Err(BlobError::BadState)), "a row alone is not a state");
        // What the catalog keeps beside the row joins back to the whole state.
        let entries: Vec<Vec<u8>> = two.entries().iter().map(|e| e.to_vec()).collect();
        assert_eq!(BlobState::join(two.row(), &entries), two);
        // The second checkpoint appends one entry; a rollback to no part replaces them all.
        assert_eq!(two.entries_from(&one), Some(1));
        assert_eq!(two.entries_from(&two), None);
        let none = S3State::fixed(16 * MIB).encode();
        assert_eq!(none.entries_from(&two), Some(0));
        assert_eq!(BlobState::default().entries_from(&two), Some(0));
        // Cut or overlong framed states are refused.
        let mut cut = two.0.clone();
        cut.pop();
        assert!(matches!(S3State::decode(&BlobState(cut)), Err(BlobError::BadState)));
        let mut long = two.0.clone();
        long.push(0);
        assert!(matches!(S3State::decode(&BlobState(long)), Err(BlobError::BadState)));
    }
}

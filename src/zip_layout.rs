//! The byte layout of a zip of stored members (PKWARE APPNOTE.TXT 6.3.10): each member's local
//! header, data and data descriptor, then the central directory and end records — a pure
//! function of the members' names, sizes and times, so any byte range of an archive can be
//! rendered without the bytes before it. The `archive` task writes zips with these records
//! (resuming mid-member), and zip downloads of several files (`http::zip`) serve any range.
//!
//! Why ferry owns this: the zip crates (`zip`, `async_zip`, `zipit`, `s-zip`) write archives
//! front to back, and `zipit`, which knows the length up front, still computes each CRC-32 as
//! it streams. None can start at byte N of an archive, which a resumed download or a resumed
//! task needs. The format's fixed parts are small; they are below.
//!
//! What every zip here is, so its bytes are the same for the same members every time:
//! - members are stored (method 0, no compression): a member's data is its file's bytes, and
//!   the archive's length follows from names and sizes alone;
//! - general purpose flag bit 3 (CRC-32 and sizes in a data descriptor after the data; the
//!   local header has zeros there, APPNOTE 4.4.4) and bit 11 (UTF-8 names), so a local header is
//!   known before its member is read; the CRC-32 is needed only by the descriptor and the
//!   central directory;
//! - times in MS-DOS form, UTC, clamped to 1980–2107; external attributes a Unix regular file
//!   `0644` (made by: Unix);
//! - ZIP64 (APPNOTE 4.5.3) where a field would not fit: a member of 4 GiB − 1 bytes or more has
//!   the ZIP64 extra field in both headers and 8-byte sizes in its descriptor; a header offset
//!   past 32 bits is in the central header's ZIP64 field; the ZIP64 end record and locator are
//!   written when the entry count, the directory's offset or its size does not fit the classic
//!   end record.
//!
//! A leaf: it names no module of ferry's.

use std::ops::Range;

/// One member as its headers describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The name in the archive (UTF-8; the caller makes it safe and unique).
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// Unix seconds of its last change.
    pub mtime: u64,
}

pub const U32_MAX: u64 = 0xFFFF_FFFF;
/// General purpose flags: bit 3 (data descriptor), bit 11 (UTF-8 names).
pub const ZIP_FLAGS: u16 = 0x0808;

pub fn zip_size64(m: &Member) -> bool {
    m.size >= U32_MAX
}

pub fn zip_version(m: &Member, offset: u64) -> u16 {
    if zip_size64(m) || offset >= U32_MAX {
        45
    } else {
        20
    }
}

/// MS-DOS (time, date) of Unix seconds, UTC, clamped to 1980..=2107.
pub fn dos_datetime(secs: u64) -> (u16, u16) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if year < 1980 {
        return (0, (1 << 5) | 1);
    }
    if year > 2107 {
        return ((23 << 11) | (59 << 5) | 29, (127 << 9) | (12 << 5) | 31);
    }
    let time = ((rem / 3600) << 11) | (((rem % 3600) / 60) << 5) | ((rem % 60) / 2);
    let date = ((year - 1980) << 9) | (month << 5) | day;
    (time as u16, date as u16)
}

pub fn put16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// Local file header of a member starting at `offset`: crc and sizes are in the descriptor.
pub fn zip_local_header(m: &Member, offset: u64) -> Vec<u8> {
    let name = m.name.as_bytes();
    let (time, date) = dos_datetime(m.mtime);
    let z64 = zip_size64(m);
    let mut b = Vec::with_capacity(30 + name.len() + 20);
    put32(&mut b, 0x0403_4b50);
    put16(&mut b, zip_version(m, offset));
    put16(&mut b, ZIP_FLAGS);
    put16(&mut b, 0); // stored
    put16(&mut b, time);
    put16(&mut b, date);
    put32(&mut b, 0); // crc: in the descriptor
    let sizes = if z64 { U32_MAX as u32 } else { 0 };
    put32(&mut b, sizes);
    put32(&mut b, sizes);
    put16(&mut b, name.len() as u16);
    put16(&mut b, if z64 { 20 } else { 0 });
    b.extend_from_slice(name);
    if z64 {
        put16(&mut b, 0x0001);
        put16(&mut b, 16);
        put64(&mut b, 0);
        put64(&mut b, 0);
    }
    b
}

pub fn zip_descriptor_len(m: &Member) -> u64 {
    if zip_size64(m) {
        24
    } else {
        16
    }
}

/// Data descriptor after a member's data (8-byte sizes for a zip64 member).
pub fn zip_descriptor(m: &Member, crc: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(24);
    put32(&mut b, 0x0807_4b50);
    put32(&mut b, crc);
    if zip_size64(m) {
        put64(&mut b, m.size);
        put64(&mut b, m.size);
    } else {
        put32(&mut b, m.size as u32);
        put32(&mut b, m.size as u32);
    }
    b
}

/// Central directory, then (if needed) the zip64 end record and locator, then the end record.
/// `cd_offset` is where the central directory starts.
pub fn zip_end(members: &[Member], starts: &[u64], crcs: &[u32], cd_offset: u64) -> Vec<u8> {
    let mut b = Vec::new();
    for ((m, &offset), &crc) in members.iter().zip(starts).zip(crcs) {
        let name = m.name.as_bytes();
        let (time, date) = dos_datetime(m.mtime);
        let z_size = zip_size64(m);
        let z_off = offset >= U32_MAX;
        let mut extra = Vec::new();
        if z_size || z_off {
            let mut fields = Vec::new();
            if z_size {
                put64(&mut fields, m.size); // uncompressed
                put64(&mut fields, m.size); // compressed
            }
            if z_off {
                put64(&mut fields, offset);
            }
            put16(&mut extra, 0x0001);
            put16(&mut extra, fields.len() as u16);
            extra.extend_from_slice(&fields);
        }
        let version = zip_version(m, offset);
        put32(&mut b, 0x0201_4b50);
        put16(&mut b, (3 << 8) | version); // made by: Unix
        put16(&mut b, version);
        put16(&mut b, ZIP_FLAGS);
        put16(&mut b, 0);
        put16(&mut b, time);
        put16(&mut b, date);
        put32(&mut b, crc);
        let size32 = if z_size { U32_MAX as u32 } else { m.size as u32 };
        put32(&mut b, size32);
        put32(&mut b, size32);
        put16(&mut b, name.len() as u16);
        put16(&mut b, extra.len() as u16);
        put16(&mut b, 0); // comment
        put16(&mut b, 0); // disk
        put16(&mut b, 0); // internal attributes
        put32(&mut b, 0o100644 << 16); // external: regular file, rw-r--r--
        put32(&mut b, if z_off { U32_MAX as u32 } else { offset as u32 });
        b.extend_from_slice(name);
        b.extend_from_slice(&extra);
    }
    let cd_size = b.len() as u64;
    let n = members.len() as u64;
    let z64 = n >= 0xFFFF || cd_size >= U32_MAX || cd_offset >= U32_MAX;
    if z64 {
        let eocd64 = cd_offset + cd_size;
        put32(&mut b, 0x0606_4b50);
        put64(&mut b, 44);
        put16(&mut b, (3 << 8) | 45);
        put16(&mut b, 45);
        put32(&mut b, 0);
        put32(&mut b, 0);
        put64(&mut b, n);
        put64(&mut b, n);
        put64(&mut b, cd_size);
        put64(&mut b, cd_offset);
        put32(&mut b, 0x0706_4b50);
        put32(&mut b, 0);
        put64(&mut b, eocd64);
        put32(&mut b, 1);
    }
    put32(&mut b, 0x0605_4b50);
    put16(&mut b, 0);
    put16(&mut b, 0);
    let n16 = n.min(0xFFFF) as u16;
    put16(&mut b, n16);
    put16(&mut b, n16);
    put32(&mut b, cd_size.min(U32_MAX) as u32);
    put32(&mut b, cd_offset.min(U32_MAX) as u32);
    put16(&mut b, 0);
    b
}

/// Where every part of one zip lies, computed from its members alone.
#[derive(Debug, Clone)]
pub struct ZipLayout {
    members: Vec<Member>,
    /// Offset of each member's local header, then of the central directory.
    starts: Vec<u64>,
    /// Offset of each member's first data byte.
    data: Vec<u64>,
    len: u64,
}

/// Which part of the archive a [`Piece`] is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Member `i`'s local header (no CRC-32 needed).
    Header(usize),
    /// Member `i`'s data: its file's bytes.
    Data(usize),
    /// Member `i`'s data descriptor (needs its CRC-32).
    Descriptor(usize),
    /// The central directory and the end records (need every member's CRC-32).
    Tail,
}

/// A run of a requested range that lies in one [`Part`]: `within` is relative to the part's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub part: Part,
    pub within: Range<u64>,
}

impl ZipLayout {
    /// Place `members` in order.
    pub fn new(members: Vec<Member>) -> ZipLayout {
        let n = members.len();
        let (mut starts, mut data) = (Vec::with_capacity(n + 1), Vec::with_capacity(n));
        let mut pos = 0u64;
        for m in &members {
            starts.push(pos);
            let d = pos + zip_local_header(m, pos).len() as u64;
            data.push(d);
            pos = d + m.size + zip_descriptor_len(m);
        }
        starts.push(pos);
        let len = pos + zip_end(&members, &starts[..n], &vec![0; n], pos).len() as u64;
        ZipLayout { members, starts, data, len }
    }

    /// The archive's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the archive has no members (it is then the 22-byte end record alone).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The parts that bytes `range` of the archive cover, in order, each with the bytes of it
    /// wanted. `range` must lie within `0..len()` (callers check it first: a 416 otherwise).
    pub fn pieces(&self, range: Range<u64>) -> Vec<Piece> {
        assert!(range.start <= range.end && range.end <= self.len, "range {range:?} outside 0..{}", self.len);
        let mut out = Vec::new();
        let mut take = |part: Part, span: Range<u64>| {
            let (s, e) = (span.start.max(range.start), span.end.min(range.end));
            if s < e {
                out.push(Piece { part, within: s - span.start..e - span.start });
            }
        };
        let n = self.members.len();
        // The first member whose bytes reach past the range's start.
        let first = self.starts[1..].partition_point(|&end| end <= range.start);
        for i in (first..n).take_while(|&i| self.starts[i] < range.end) {
            let data_end = self.data[i] + self.members[i].size;
            take(Part::Header(i), self.starts[i]..self.data[i]);
            take(Part::Data(i), self.data[i]..data_end);
            take(Part::Descriptor(i), data_end..self.starts[i + 1]);
        }
        take(Part::Tail, self.starts[n]..self.len);
        out
    }

    /// The bytes of member `i`'s local header ([`zip_local_header`]).
    pub fn header(&self, i: usize) -> Vec<u8> {
        zip_local_header(&self.members[i], self.starts[i])
    }

    /// The bytes of member `i`'s data descriptor with `crc32` ([`zip_descriptor`]).
    pub fn descriptor(&self, i: usize, crc32: u32) -> Vec<u8> {
        zip_descriptor(&self.members[i], crc32)
    }

    /// The bytes after the last member ([`zip_end`]); `crc32s` has one CRC-32 per member, in order.
    pub fn tail(&self, crc32s: &[u32]) -> Vec<u8> {
        assert_eq!(crc32s.len(), self.members.len(), "one CRC-32 per member");
        let n = self.members.len();
        zip_end(&self.members, &self.starts[..n], crc32s, self.starts[n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom};

    /// The whole archive of `files` (name, bytes) rendered piece by piece, for `range`.
    fn render(layout: &ZipLayout, files: &[Vec<u8>], range: Range<u64>) -> Vec<u8> {
        let crcs: Vec<u32> = files.iter().map(|f| crc32fast::hash(f)).collect();
        let mut out = Vec::new();
        for piece in layout.pieces(range) {
            let w = piece.within.start as usize..piece.within.end as usize;
            match piece.part {
                Part::Header(i) => out.extend_from_slice(&layout.header(i)[w]),
                Part::Data(i) => out.extend_from_slice(&files[i][w]),
                Part::Descriptor(i) => out.extend_from_slice(&layout.descriptor(i, crcs[i])[w]),
                Part::Tail => out.extend_from_slice(&layout.tail(&crcs)[w]),
            }
        }
        out
    }

    fn small() -> (ZipLayout, Vec<Vec<u8>>) {
        let files = vec![b"hello, world\n".to_vec(), Vec::new(), (0..5000u32).map(|i| (i % 251) as u8).collect()];
        let names = ["a.txt", "empty", "résumé (final).bin"];
        let members = names.iter().zip(&files).map(|(n, f)| Member { name: n.to_string(), size: f.len() as u64, mtime: 1_700_000_000 }).collect();
        (ZipLayout::new(members), files)
    }

    #[test]
    fn a_small_zip_reads_back_with_the_zip_crate() {
        let (layout, files) = small();
        let bytes = render(&layout, &files, 0..layout.len());
        assert_eq!(bytes.len() as u64, layout.len());
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
        assert_eq!(zip.len(), 3);
        for (i, (name, data)) in ["a.txt", "empty", "résumé (final).bin"].iter().zip(&files).enumerate() {
            let mut f = zip.by_index(i).unwrap();
            assert_eq!(f.name().unwrap(), *name);
            assert_eq!(f.compression(), zip::CompressionMethod::Stored);
            assert_eq!(f.crc32(), crc32fast::hash(data));
            // 2023-11-14 22:13:20 UTC, to the even second.
            let t = f.last_modified().unwrap();
            assert_eq!((t.year(), t.month(), t.day(), t.hour(), t.minute(), t.second()), (2023, 11, 14, 22, 13, 20));
            assert_eq!(f.unix_mode(), Some(0o100_644));
            let mut got = Vec::new();
            f.read_to_end(&mut got).unwrap(); // checks the CRC-32 too
            assert_eq!(&got, data);
        }
    }

    #[test]
    fn every_range_is_the_slice_of_the_whole() {
        let (layout, files) = small();
        let whole = render(&layout, &files, 0..layout.len());
        let len = layout.len();
        for start in 0..len {
            for end in [start, start + 1, (start + 37).min(len), (start + 300).min(len), len] {
                assert_eq!(render(&layout, &files, start..end), &whole[start as usize..end as usize], "{start}..{end}");
            }
        }
    }

    #[test]
    fn no_members_is_the_end_record_alone() {
        let layout = ZipLayout::new(Vec::new());
        assert_eq!(layout.len(), 22);
        let bytes = render(&layout, &[], 0..22);
        assert_eq!(zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap().len(), 0);
    }

    /// An archive of members too large to hold, read through `Read + Seek` where a member's
    /// data is zeros: the zip crate finds every member by the ZIP64 fields alone.
    struct Sparse {
        layout: ZipLayout,
        crcs: Vec<u32>,
        pos: u64,
    }

    impl Read for Sparse {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let end = (self.pos + buf.len() as u64).min(self.layout.len());
            let mut n = 0;
            for piece in self.layout.pieces(self.pos..end) {
                let w = piece.within.start as usize..piece.within.end as usize;
                let len = w.len();
                match piece.part {
                    Part::Header(i) => buf[n..n + len].copy_from_slice(&self.layout.header(i)[w]),
                    Part::Data(_) => buf[n..n + len].fill(0),
                    Part::Descriptor(i) => buf[n..n + len].copy_from_slice(&self.layout.descriptor(i, self.crcs[i])[w]),
                    Part::Tail => buf[n..n + len].copy_from_slice(&self.layout.tail(&self.crcs)[w]),
                }
                n += len;
            }
            self.pos = end;
            Ok(n)
        }
    }

    impl Seek for Sparse {
        fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
            self.pos = match to {
                SeekFrom::Start(p) => p,
                SeekFrom::End(d) => self.layout.len().checked_add_signed(d).unwrap(),
                SeekFrom::Current(d) => self.pos.checked_add_signed(d).unwrap(),
            };
            Ok(self.pos)
        }
    }

    #[test]
    fn zip64_sizes_and_offsets_past_4_gib() {
        const GIB: u64 = 1 << 30;
        const FULL32: u64 = U32_MAX;
        // A member of exactly 0xFFFFFFFF bytes needs ZIP64 too (the value is the marker).
        let sizes = [5 * GIB, 3, FULL32, 10, 0];
        let members: Vec<Member> = sizes.iter().enumerate().map(|(i, &size)| Member { name: format!("m{i}.bin"), size, mtime: 0 }).collect();
        let layout = ZipLayout::new(members);
        let crcs: Vec<u32> = (0..sizes.len() as u32).map(|i| 0x1234_0000 + i).collect();
        // Offsets by hand: header 30 + name 6 (+ 20 ZIP64 extra), descriptor 16 (24 for ZIP64).
        let m0 = 0;
        let m1 = m0 + 30 + 6 + 20 + 5 * GIB + 24;
        let m2 = m1 + 30 + 6 + 3 + 16;
        let m3 = m2 + 30 + 6 + 20 + FULL32 + 24;
        let m4 = m3 + 30 + 6 + 10 + 16;
        let central = m4 + 30 + 6 + 16;
        // Central headers: 46 + name, + 4 + 8·fields of ZIP64 extra (sizes for m0, m2; the
        // offset for m1..m4, all past 4 GiB; m2 has both).
        let central_len = (46 + 6 + 4 + 16) + (46 + 6 + 4 + 8) + (46 + 6 + 4 + 24) + 2 * (46 + 6 + 4 + 8);
        assert_eq!(layout.len(), central + central_len + 56 + 20 + 22);
        let starts = [m0, m1, m2, m3, m4];
        for (i, &size) in sizes.iter().enumerate() {
            let data = starts[i] + 36 + if size >= FULL32 { 20 } else { 0 };
            if size > 0 {
                assert_eq!(layout.pieces(data..data + 1)[0].part, Part::Data(i));
                assert_eq!(layout.pieces(data + size - 1..data + size + 1)[1], Piece { part: Part::Descriptor(i), within: 0..1 });
            }
        }

        let tail = layout.tail(&crcs);
        let end = &tail[tail.len() - 22..];
        assert_eq!(&end[10..12], &5u16.to_le_bytes(), "a count that fits stays");
        assert_eq!(&end[12..16], &(central_len as u32).to_le_bytes(), "the directory's size fits");
        assert_eq!(&end[16..20], &[0xFF; 4], "its offset does not: see ZIP64");
        let locator = &tail[tail.len() - 42..tail.len() - 22];
        assert_eq!(&locator[8..16], &(central + central_len).to_le_bytes(), "the locator points at the ZIP64 end record");

        let mut zip = zip::ZipArchive::new(Sparse { layout: layout.clone(), crcs: crcs.clone(), pos: 0 }).unwrap();
        assert_eq!(zip.len(), 5);
        for (i, &size) in sizes.iter().enumerate() {
            let f = zip.by_index_raw(i).unwrap();
            assert_eq!((f.name().unwrap().as_ref(), f.size(), f.compressed_size(), f.crc32()), (format!("m{i}.bin").as_str(), size, size, crcs[i]));
            assert_eq!(f.header_start(), starts[i], "member {i}");
        }
        // Any range, even one inside a 5 GiB member, renders without the bytes before it.
        assert_eq!(layout.pieces(3 * GIB..3 * GIB + 10), vec![Piece { part: Part::Data(0), within: 3 * GIB - 56..3 * GIB - 46 }]);
    }

    #[test]
    fn many_members_need_the_zip64_end_record() {
        let members: Vec<Member> = (0..70_000).map(|i| Member { name: format!("{i}"), size: 1, mtime: 0 }).collect();
        let layout = ZipLayout::new(members);
        let tail = layout.tail(&vec![0; 70_000]);
        let end = &tail[tail.len() - 22..];
        assert_eq!(&end[8..12], &[0xFF; 4], "the counts are in the ZIP64 end record");
        let end64 = &tail[tail.len() - 98..tail.len() - 42];
        assert_eq!(&end64[..4], &0x0606_4b50u32.to_le_bytes());
        assert_eq!(&end64[24..32], &70_000u64.to_le_bytes());
    }
}

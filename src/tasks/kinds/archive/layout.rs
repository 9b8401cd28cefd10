//! The byte layout of an archive: where every member's header, data and trailer go, as a pure
//! function of the format and the members (names, sizes, mtimes), so a resumed run writes exactly
//! the bytes an uninterrupted one would. Tar (ustar, GNU long names) and zip (Stored, data
//! descriptors, zip64 where sizes or offsets need it), and the crc32 combination a resumed zip
//! member needs.

use super::{Format, Member};

/// Where everything goes: a pure function of the format and the members.
pub(super) struct Layout<'a> {
    pub(super) format: Format,
    pub(super) members: &'a [Member],
    /// Start of each member's header, then the start of the trailer (zip: central directory).
    pub(super) starts: Vec<u64>,
    /// Total archive length.
    pub(super) len: u64,
}

impl<'a> Layout<'a> {
    pub(super) fn new(format: Format, members: &'a [Member]) -> Self {
        let mut starts = Vec::with_capacity(members.len() + 1);
        let mut pos = 0u64;
        for m in members {
            starts.push(pos);
            pos += match format {
                Format::Tar => tar_header(m).len() as u64 + m.size + tar_padding(m.size) as u64,
                Format::Zip => zip_local_header(m, pos).len() as u64 + m.size + zip_descriptor_len(m),
            };
        }
        starts.push(pos);
        let len = match format {
            Format::Tar => pos + 1024,
            Format::Zip => pos + zip_end(members, &starts[..members.len()], &vec![0; members.len()], pos).len() as u64,
        };
        Layout { format, members, starts, len }
    }

    /// The header bytes of member `i`.
    pub(super) fn header(&self, i: usize) -> Vec<u8> {
        match self.format {
            Format::Tar => tar_header(&self.members[i]),
            Format::Zip => zip_local_header(&self.members[i], self.starts[i]),
        }
    }

    /// The bytes after member `i`'s data (tar padding, zip data descriptor).
    pub(super) fn trailer(&self, i: usize, crc: u32) -> Vec<u8> {
        match self.format {
            Format::Tar => vec![0; tar_padding(self.members[i].size)],
            Format::Zip => zip_descriptor(&self.members[i], crc),
        }
    }

    /// The archive's end (tar: two zero blocks; zip: central directory and end records).
    pub(super) fn end(&self, crcs: &[u32]) -> Vec<u8> {
        let n = self.members.len();
        match self.format {
            Format::Tar => vec![0; 1024],
            Format::Zip => zip_end(self.members, &self.starts[..n], crcs, self.starts[n]),
        }
    }

    /// The archive offset once members `[0, member)` are complete and `offset` bytes of member
    /// `member`'s data are written (`offset == 0`: before its header).
    pub(super) fn position(&self, member: usize, offset: u64) -> u64 {
        if offset == 0 {
            return self.starts[member];
        }
        let header = match self.format {
            Format::Tar => tar_header(&self.members[member]).len(),
            Format::Zip => zip_local_header(&self.members[member], self.starts[member]).len(),
        };
        self.starts[member] + header as u64 + offset
    }
}

// ---------------------------------------------------------------------------------------------
// Tar (GNU format: long names as `././@LongLink` entries, big sizes in base-256)

pub(super) fn tar_padding(size: u64) -> usize {
    ((512 - size % 512) % 512) as usize
}

pub(super) fn tar_block(name: &[u8], size: u64, mtime: u64, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    let n = name.len().min(100);
    h.as_old_mut().name[..n].copy_from_slice(&name[..n]);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_entry_type(kind);
    h.set_cksum();
    h
}

/// The header block(s) of a member: a GNU long-name entry first when the name exceeds 100 bytes.
pub(super) fn tar_header(m: &Member) -> Vec<u8> {
    let name = m.name.as_bytes();
    let mut out = Vec::with_capacity(512);
    if name.len() > 100 {
        let long = tar_block(b"././@LongLink", name.len() as u64 + 1, 0, tar::EntryType::GNULongName);
        out.extend_from_slice(long.as_bytes());
        out.extend_from_slice(name);
        out.push(0);
        out.resize(out.len() + tar_padding(name.len() as u64 + 1), 0);
    }
    out.extend_from_slice(tar_block(name, m.size, m.mtime, tar::EntryType::Regular).as_bytes());
    out
}

// ---------------------------------------------------------------------------------------------
// Zip (Stored members, data descriptors, UTF-8 names, zip64 where needed)

pub(super) const U32_MAX: u64 = 0xFFFF_FFFF;
/// General purpose flags: bit 3 (data descriptor), bit 11 (UTF-8 names).
pub(super) const ZIP_FLAGS: u16 = 0x0808;

pub(super) fn zip_size64(m: &Member) -> bool {
    m.size >= U32_MAX
}

pub(super) fn zip_version(m: &Member, offset: u64) -> u16 {
    if zip_size64(m) || offset >= U32_MAX {
        45
    } else {
        20
    }
}

/// MS-DOS (time, date) of Unix seconds, UTC, clamped to 1980..=2107.
pub(super) fn dos_datetime(secs: u64) -> (u16, u16) {
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

pub(super) fn put16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(super) fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}
pub(super) fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// Local file header of a member starting at `offset`: crc and sizes are in the descriptor.
pub(super) fn zip_local_header(m: &Member, offset: u64) -> Vec<u8> {
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

pub(super) fn zip_descriptor_len(m: &Member) -> u64 {
    if zip_size64(m) {
        24
    } else {
        16
    }
}

/// Data descriptor after a member's data (8-byte sizes for a zip64 member).
pub(super) fn zip_descriptor(m: &Member, crc: u32) -> Vec<u8> {
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
pub(super) fn zip_end(members: &[Member], starts: &[u64], crcs: &[u32], cd_offset: u64) -> Vec<u8> {
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

// ---------------------------------------------------------------------------------------------
// crc32 resumption

pub(super) fn gf2_times(mat: &[u32; 32], mut vec: u32) -> u32 {
    let mut sum = 0;
    let mut rows = mat.iter();
    while vec != 0 {
        let row = rows.next().expect("32 rows");
        if vec & 1 != 0 {
            sum ^= row;
        }
        vec >>= 1;
    }
    sum
}

pub(super) fn gf2_square(mat: &[u32; 32]) -> [u32; 32] {
    let mut sq = [0u32; 32];
    for (s, &row) in sq.iter_mut().zip(mat) {
        *s = gf2_times(mat, row);
    }
    sq
}

/// crc32 of `A ‖ B` from crc32(A), crc32(B) and len(B) (zlib's `crc32_combine`).
pub(super) fn crc32_combine(crc1: u32, crc2: u32, len2: u64) -> u32 {
    if len2 == 0 {
        return crc1;
    }
    // The operator for one zero bit, then squared to 2 and 4 zero bits.
    let mut odd = [0u32; 32];
    odd[0] = 0xEDB8_8320;
    for (n, r) in odd.iter_mut().enumerate().skip(1) {
        *r = 1 << (n - 1);
    }
    let even = gf2_square(&odd);
    let mut odd = gf2_square(&even);
    let mut crc1 = crc1;
    let mut len2 = len2;
    loop {
        let even = gf2_square(&odd);
        if len2 & 1 != 0 {
            crc1 = gf2_times(&even, crc1);
        }
        len2 >>= 1;
        if len2 == 0 {
            break;
        }
        odd = gf2_square(&even);
        if len2 & 1 != 0 {
            crc1 = gf2_times(&odd, crc1);
        }
        len2 >>= 1;
        if len2 == 0 {
            break;
        }
    }
    crc1 ^ crc2
}

//! The byte layout of an archive: where every member's header, data and trailer go, as a pure
//! function of the format and the members (names, sizes, mtimes), so a resumed run writes exactly
//! the bytes an uninterrupted one would. Tar (ustar, GNU long names) and zip (Stored, data
//! descriptors, zip64 where sizes or offsets need it: the records are [`crate::zip_layout`]'s,
//! which zip downloads of several files share), and the crc32 combination a resumed zip member
//! needs.

use super::{Format, Member};
#[cfg(test)]
pub(super) use crate::zip_layout::dos_datetime;
pub(super) use crate::zip_layout::{zip_descriptor, zip_descriptor_len, zip_end, zip_local_header};

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

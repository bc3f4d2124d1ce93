//! The swap area's header: the first page of a Linux swap area, as `mkswap` writes it, with
//! the area's random id.

use super::SLOT_BYTES;

/// The first page of a Linux swap area (`union swap_header`, version 1): the signature in
/// its last 10 bytes, the last page's index, no bad pages, and the area's id. The id is what
/// tells this area from another of the same size: zram's backing store pins the header as
/// its remote store's identity, so a store that restarted empty or a different export is
/// never read as this one.
pub(super) fn swap_header(slots: u64, uuid: &[u8; 16], stamp: &[u8; 16]) -> Vec<u8> {
    let mut page = vec![0u8; SLOT_BYTES as usize];
    page[1024..1028].copy_from_slice(&1u32.to_ne_bytes()); // version
    page[1028..1032].copy_from_slice(&((slots - 1) as u32).to_ne_bytes()); // last_page
    page[UUID].copy_from_slice(uuid); // sws_uuid
    page[STAMP].copy_from_slice(stamp);
    page[4086..4096].copy_from_slice(b"SWAPSPACE2");
    page
}

/// Where the header holds `sws_uuid`.
const UUID: std::ops::Range<usize> = 1036..1052;
/// The owner's stamp: the first words of the header's `padding[117]`, after `sws_volume`
/// (ignored by Linux and by `mkswap`'s readers).
const STAMP: std::ops::Range<usize> = 1068..1084;

/// A version-1 swap header's id, stamp and last page, if `page` is one.
pub(super) fn parse_header(page: &[u8]) -> Option<([u8; 16], [u8; 16], u32)> {
    if page.len() != SLOT_BYTES as usize || &page[4086..4096] != b"SWAPSPACE2" {
        return None;
    }
    let word = |at: usize| u32::from_ne_bytes(page[at..at + 4].try_into().expect("4 bytes"));
    if word(1024) != 1 {
        return None;
    }
    let uuid = page[UUID].try_into().expect("16 bytes");
    let stamp = page[STAMP].try_into().expect("16 bytes");
    Some((uuid, stamp, word(1028)))
}

/// A random (version 4) UUID, as `mkswap` gives each area: from the kernel's random pool,
/// or, if `/dev/urandom` cannot be read, from the clock, the process and a hasher's random
/// keys, which still differ between any two areas made here.
pub(super) fn random_uuid() -> [u8; 16] {
    use std::io::Read;
    let mut id = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut id));
    if read.is_err() {
        use std::hash::{BuildHasher, Hasher};
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        for (i, half) in id.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(now);
            h.write_u32(std::process::id());
            h.write_usize(i);
            half.copy_from_slice(&h.finish().to_ne_bytes());
        }
    }
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

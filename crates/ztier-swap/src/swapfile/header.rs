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

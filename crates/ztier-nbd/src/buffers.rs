//! Payload buffers for one connection: a write's data on its way to the device, a read's on
//! its way to the client.
//!
//! Each buffer is an anonymous mapping of its own (`ztier_base::mapping::MappedBytes`, the
//! project's one owner of mappings, seen safely as bytes), reused for later requests of the
//! connection and unmapped when the connection ends. Two costs go away that a fresh `vec![0; len]` per
//! request paid: zeroing the buffer before the socket or the device fills it, and faulting
//! in fresh pages (docs/diary.md has their share of the server's CPU). And because they
//! are mappings, not heap memory, a finished connection's buffers go back to the OS whatever
//! the allocator would have kept in its per-thread arenas.
//!
//! Invariants: the pool keeps at most `keep_bytes` of mappings (the connection's in-flight
//! budget), so it never holds more than the requests in flight needed at once, and the pools
//! of a server together at most their `KeptBytes` bound; a buffer serves only lengths up to
//! its mapping's size. Lock: `free` is held only to take or
//! give back a mapping, never across I/O or the device.

use std::io;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ztier_base::mapping::MappedBytes;

/// The smallest mapping made: small requests share the size, so any buffer serves any of
/// them (4 KiB random I/O reuses the same few).
const MIN_MAP: usize = 64 << 10;

/// The bytes a request of `len` maps (what a buffer for it costs the budget).
pub(crate) fn mapped_len(len: usize) -> usize {
    match len {
        0 => 0,
        n => n.next_power_of_two().max(MIN_MAP),
    }
}

/// Bytes of mappings kept for reuse by every connection of a server together, and their
/// bound.
pub(crate) struct KeptBytes {
    bytes: AtomicUsize,
    limit: usize,
}

impl KeptBytes {
    pub(crate) fn new(limit: usize) -> KeptBytes {
        KeptBytes {
            bytes: AtomicUsize::new(0),
            limit,
        }
    }

    /// Counts `n` more bytes kept, if they fit under the bound.
    fn try_keep(&self, n: usize) -> bool {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                (b + n <= self.limit).then_some(b + n)
            })
            .is_ok()
    }

    fn unkeep(&self, n: usize) {
        self.bytes.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A connection's free buffers.
pub(crate) struct Buffers {
    free: Mutex<Free>,
    keep_bytes: usize,
    /// The server's count of kept bytes, which this pool's also counts in.
    kept: Arc<KeptBytes>,
}

/// The mappings kept for reuse, and their bytes.
#[derive(Default)]
struct Free {
    maps: Vec<MappedBytes>,
    bytes: usize,
}

/// `len` bytes of a mapping taken from [`Buffers`]; give it back with [`Buffers::give`].
pub(crate) struct Buffer {
    map: Option<MappedBytes>,
    len: usize,
}

impl Buffers {
    pub(crate) fn new(keep_bytes: usize, kept: Arc<KeptBytes>) -> Buffers {
        Buffers {
            free: Mutex::new(Free::default()),
            keep_bytes,
            kept,
        }
    }

    /// A buffer of `len` bytes (their content is whatever an earlier request left, or
    /// zeros): the smallest free mapping that holds it, or a new one.
    pub(crate) fn take(&self, len: usize) -> io::Result<Buffer> {
        if len == 0 {
            return Ok(Buffer { map: None, len });
        }
        let reused = {
            let mut free = self.free.lock().expect("buffers");
            let best = free
                .maps
                .iter()
                .enumerate()
                .filter(|(_, m)| m.len() >= len)
                .min_by_key(|(_, m)| m.len())
                .map(|(i, _)| i);
            best.map(|i| {
                let map = free.maps.swap_remove(i);
                free.bytes -= map.len();
                self.kept.unkeep(map.len());
                map
            })
        };
        let map = match reused {
            Some(map) => map,
            None => MappedBytes::new(mapped_len(len))?,
        };
        Ok(Buffer {
            map: Some(map),
            len,
        })
    }

    /// Returns a buffer's mapping for reuse, or unmaps it if the pool holds enough.
    pub(crate) fn give(&self, buffer: Buffer) {
        let Some(map) = buffer.map else { return };
        let mut free = self.free.lock().expect("buffers");
        if free.bytes + map.len() <= self.keep_bytes && self.kept.try_keep(map.len()) {
            free.bytes += map.len();
            free.maps.push(map);
        }
    }

    /// Bytes of mappings held for reuse.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.free.lock().unwrap().bytes
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        let free = self.free.get_mut().unwrap_or_else(|p| p.into_inner());
        self.kept.unkeep(free.bytes);
    }
}

impl Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.map {
            Some(m) => &m[..self.len],
            None => &[],
        }
    }
}

impl DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.map {
            Some(m) => &mut m[..self.len],
            None => &mut [],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_smallest_first_and_bounded() {
        let pool = Buffers::new(1 << 20, Arc::new(KeptBytes::new(usize::MAX / 2)));
        let mut a = pool.take(4096).unwrap();
        a[..4].copy_from_slice(b"abcd");
        let b = pool.take(300 << 10).unwrap();
        assert_eq!((a.len(), b.len()), (4096, 300 << 10));
        pool.give(a);
        pool.give(b);
        assert_eq!(pool.held(), MIN_MAP + (512 << 10));
        // A small request takes the small mapping back, with what it held.
        let c = pool.take(100).unwrap();
        assert_eq!(&c[..4], b"abcd");
        assert_eq!(c.map.as_ref().unwrap().len(), MIN_MAP);
        // A large one takes the large mapping; one larger still maps anew.
        let d = pool.take(400 << 10).unwrap();
        assert_eq!(d.map.as_ref().unwrap().len(), 512 << 10);
        let e = pool.take(600 << 10).unwrap();
        assert_eq!(e.map.as_ref().unwrap().len(), 1 << 20);
        pool.give(c);
        pool.give(d);
        pool.give(e);
        // The pool keeps at most its budget: the 1 MiB mapping did not fit beside the rest.
        assert_eq!(pool.held(), MIN_MAP + (512 << 10));
        let empty = pool.take(0).unwrap();
        assert!(empty.is_empty());
        pool.give(empty);
    }
}

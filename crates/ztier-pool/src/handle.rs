//! Handle bit packing, and the tag that makes a handle name its pool: the one copy every
//! allocator uses.
//!
//! A handle is a `u64` with bit 0 set (so it is never 0), the pool's tag in the top
//! [`POOL_TAG_BITS`] bits, and the allocator's own fields between them, each a [`Field`]
//! laid out from bit 1 up with `Field::after` (`ztier_base::bits`):
//!
//! ```text
//!  63        54 53                                   1 0
//! | pool tag   | the allocator's fields (53 bits)     |1|
//! ```
//!
//! Invariants: no two live pools hold the same tag (tags come from a process-wide set and go
//! back to it when the pool is dropped), so a handle of one live pool is never taken for an
//! object of another; the tag a dropped pool leaves is handed out again only after every other
//! free tag, so a stale handle of a dropped pool is refused by the next pools too.
//!
//! Locking: `TAGS`, taken only when a pool is made or dropped; it takes no other lock.

use std::sync::Mutex;

use crate::{Handle, PoolError};

pub(crate) use ztier_base::bits::Field;

/// Bit 0: always set.
pub(crate) const TAG_BIT: Field = Field::at(0, 1);

/// Bits a pool tag takes: live pools at most `1 << POOL_TAG_BITS`.
pub(crate) const POOL_TAG_BITS: u32 = 10;
/// The pool tag, in the top bits.
pub(crate) const POOL_TAG: Field = Field::at(64 - POOL_TAG_BITS, POOL_TAG_BITS);

/// Assembles a handle from its fields' bits (each already placed by [`Field::put`]) and the
/// pool's tag.
#[inline]
pub(crate) fn make(tag: &PoolTag, fields: u64) -> Handle {
    let raw = POOL_TAG.put(tag.0 as u64) | fields | TAG_BIT.put(1);
    Handle::from_raw(raw).expect("bit 0 is set")
}

/// The handle's bits below the pool tag, if it is one of this pool's handles; else
/// [`PoolError::UnknownHandle`].
#[inline]
pub(crate) fn open(tag: &PoolTag, handle: Handle) -> Result<u64, PoolError> {
    let raw = handle.raw();
    if TAG_BIT.get(raw) != 1 || POOL_TAG.get(raw) != tag.0 as u64 {
        return Err(PoolError::UnknownHandle { handle: raw });
    }
    Ok(POOL_TAG.clear(raw))
}

/// A live pool's tag; given back to the process's set when dropped.
#[derive(Debug)]
pub(crate) struct PoolTag(u16);

const TAG_COUNT: usize = 1 << POOL_TAG_BITS;

/// Which tags live pools hold, and where the search for a free one starts (just past the
/// last one handed out, so a freed tag is reused last).
struct Tags {
    used: [bool; TAG_COUNT],
    next: usize,
}

static TAGS: Mutex<Tags> = Mutex::new(Tags {
    used: [false; TAG_COUNT],
    next: 0,
});

fn tags() -> std::sync::MutexGuard<'static, Tags> {
    // Each critical section flips one flag and moves the cursor: nothing is left half-done by
    // a panic, so a poisoned lock is taken as it is.
    TAGS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl PoolTag {
    /// A tag no other live pool holds, or [`PoolError::TooManyPools`].
    pub fn new() -> Result<PoolTag, PoolError> {
        let mut t = tags();
        let start = t.next;
        let free = (0..TAG_COUNT)
            .map(|i| (start + i) % TAG_COUNT)
            .find(|&i| !t.used[i])
            .ok_or(PoolError::TooManyPools { max: TAG_COUNT })?;
        t.used[free] = true;
        t.next = (free + 1) % TAG_COUNT;
        Ok(PoolTag(free as u16))
    }
}

impl Drop for PoolTag {
    fn drop(&mut self) {
        tags().used[self.0 as usize] = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_opens_to_its_fields() {
        let a = Field::after(TAG_BIT, 30);
        let b = Field::after(a, 9);
        let tag = PoolTag::new().unwrap();
        let h = make(&tag, a.put(a.max()) | b.put(5));
        let bits = open(&tag, h).unwrap();
        assert_eq!((a.get(bits), b.get(bits)), (a.max(), 5));
    }

    #[test]
    fn live_pools_never_share_a_tag_and_a_freed_tag_comes_back_last() {
        let a = PoolTag::new().unwrap();
        let b = PoolTag::new().unwrap();
        assert_ne!(a.0, b.0);
        let h = make(&a, 0);
        assert!(open(&b, h).is_err(), "b refuses a's handle");
        let old = a.0;
        drop(a);
        let c = PoolTag::new().unwrap();
        assert_ne!(c.0, old, "a freed tag is not reused at once");
        assert!(open(&c, h).is_err(), "nor is a dropped pool's handle taken");
    }
}

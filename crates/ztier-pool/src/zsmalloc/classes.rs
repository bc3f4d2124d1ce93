//! zsmalloc's size-class table, computed as `zs_create_pool()` does.
//!
//! Class `i` holds objects of `ZS_MIN_ALLOC_SIZE + i * delta` bytes (delta = page size >> 8,
//! the last class clamped to the page size). Each class's zspage is a chain of 1..=chain_size
//! pages chosen by a [`ChainRule`]. Walking from the largest class down, a class with the same
//! (pages per zspage, objects per zspage) as the previous one is merged into it: requests of
//! its sizes are served by the larger class. Classes holding one object in one page are
//! "huge"; `huge_class_size` is the largest non-huge class size minus `ZS_HANDLE_SIZE - 1`,
//! the compressed length from which zram stores a page raw.
//!
//! Multi-page classes (a pool whose largest object is a unit of several pages, for zram's
//! large compression units; the idea of OPPO's 2024 multi-page zsmalloc RFC): above the page
//! size come classes `page_size + k * large_delta` (large delta = largest object >>
//! `CLASS_BITS`) up to the largest object. A large class's zspage is a chain of as many pages
//! as one object needs, up to `chain_size` pages or [`LARGE_CHAIN_FACTOR`] times that fewest
//! (whichever is more) where that holds more than one object, chosen by the same rule; a class whose one object fills its chain exactly is huge (no
//! header). `huge_class_size` is then the largest class below the largest object, less the
//! header: a unit compressing to more is stored raw. A pool without them (the default) has
//! exactly the kernel's table.

use serde::Serialize;

/// Bytes zsmalloc reserves in every non-huge object for the back-pointer to its handle.
pub const ZS_HANDLE_SIZE: usize = 8;
/// Smallest class size (and alignment unit of all class sizes).
pub const ZS_MIN_ALLOC_SIZE: usize = 32;
/// `CONFIG_ZSMALLOC_CHAIN_SIZE` of today's kernel.
pub const DEFAULT_CHAIN_SIZE: usize = 8;
/// Valid chain sizes (the kernel's Kconfig allows 4..16; 1..3 are accepted for study).
pub const CHAIN_SIZE_RANGE: std::ops::RangeInclusive<usize> = 1..=16;

/// A class above the page size (a large unit's objects) may chain up to this many times
/// its fewest pages, whatever the chain size.
pub const LARGE_CHAIN_FACTOR: usize = 4;
/// Class index bits: the class delta is `page_size >> CLASS_BITS`.
const CLASS_BITS: u32 = 8;
/// The largest object a multi-page pool takes (a 64 KiB compression unit).
pub const MAX_OBJECT_SIZE: usize = 64 << 10;

/// How a class's zspage chain length is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ChainRule {
    /// Today's `calculate_zspage_chain_size()`: the length 1..=N wasting the fewest bytes
    /// (first found wins ties); power-of-two sizes get one page.
    #[default]
    LeastWaste,
    /// The 2022 seed patch's `get_pages_per_zspage()`: the length with the best integer
    /// used percentage (first found wins ties).
    UsedPercent,
}

impl ChainRule {
    pub fn name(self) -> &'static str {
        match self {
            ChainRule::LeastWaste => "least-waste",
            ChainRule::UsedPercent => "used-percent",
        }
    }

    /// Pages per zspage for a class: from the fewest that hold one object (1 up to a page)
    /// to `chain_size` (or that fewest, if more), the one the rule prefers.
    fn pages_per_zspage(self, class_size: usize, page_size: usize, chain_size: usize) -> usize {
        let fewest = class_size.div_ceil(page_size);
        let most = chain_size.max(fewest);
        match self {
            ChainRule::LeastWaste => {
                if class_size.is_power_of_two() {
                    return fewest;
                }
                let mut best = fewest;
                let mut min_waste = usize::MAX;
                for i in fewest..=most {
                    let waste = (i * page_size) % class_size;
                    if waste < min_waste {
                        min_waste = waste;
                        best = i;
                    }
                }
                best
            }
            ChainRule::UsedPercent => {
                let mut best = fewest;
                let mut max_used_pc = 0;
                for i in fewest..=most {
                    let zspage_size = i * page_size;
                    let waste = zspage_size % class_size;
                    let used_pc = (zspage_size - waste) * 100 / zspage_size;
                    if used_pc > max_used_pc {
                        max_used_pc = used_pc;
                        best = i;
                    }
                }
                best
            }
        }
    }
}

impl std::str::FromStr for ChainRule {
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Self, crate::UnknownName> {
        match s {
            "least-waste" => Ok(ChainRule::LeastWaste),
            "used-percent" => Ok(ChainRule::UsedPercent),
            _ => Err(crate::UnknownName::ChainRule(s.to_string())),
        }
    }
}

/// One unique (unmerged) size class.
#[derive(Debug, Clone, Serialize)]
pub struct ClassSpec {
    /// The kernel's class index (position in `size_class[]`).
    pub index: usize,
    /// Object size in bytes, handle header included.
    pub size: usize,
    pub pages_per_zspage: usize,
    pub objs_per_zspage: usize,
    /// One object filling its zspage (one page, or a multi-page class's exact chain),
    /// stored without a header.
    pub huge: bool,
}

/// The class layout of a pool.
#[derive(Debug, Clone)]
pub struct ClassTable {
    pub page_size: usize,
    pub chain_size: usize,
    pub rule: ChainRule,
    /// The largest object: the page size, or a multi-page unit above it.
    pub max_object: usize,
    /// Kernel class indexes below the page size's (the kernel's table).
    small_indexes: usize,
    /// Unique classes in ascending size order.
    pub classes: Vec<ClassSpec>,
    /// For each kernel class index, the position in `classes` serving it.
    slot_of_index: Vec<u16>,
    /// Largest non-huge class size.
    pub huge_watermark: usize,
    /// Compressed lengths from this size up are stored raw by zram.
    pub huge_class_size: usize,
}

impl ClassTable {
    /// The kernel's table: objects up to one page.
    pub fn new(page_size: usize, chain_size: usize, rule: ChainRule) -> ClassTable {
        ClassTable::with_max_object(page_size, chain_size, rule, page_size)
    }

    /// The kernel's table, then multi-page classes up to `max_object` (a power of two from
    /// the page size to [`MAX_OBJECT_SIZE`]; the page size gives the kernel's table alone).
    pub fn with_max_object(
        page_size: usize,
        chain_size: usize,
        rule: ChainRule,
        max_object: usize,
    ) -> ClassTable {
        assert!(page_size.is_power_of_two() && page_size >= 4096);
        assert!(CHAIN_SIZE_RANGE.contains(&chain_size));
        assert!(max_object.is_power_of_two() && max_object >= page_size);
        let delta = page_size >> CLASS_BITS;
        let small_indexes = (page_size - ZS_MIN_ALLOC_SIZE).div_ceil(delta) + 1;
        let large_delta = max_object >> CLASS_BITS;
        let large_indexes = (max_object - page_size) / large_delta;
        let nr_classes = small_indexes + large_indexes;
        let size_of = |i: usize| {
            if i < small_indexes {
                (ZS_MIN_ALLOC_SIZE + i * delta).min(page_size)
            } else {
                page_size + (i - small_indexes + 1) * large_delta
            }
        };

        let mut descending: Vec<ClassSpec> = Vec::new();
        let mut index_to_desc = vec![0usize; nr_classes];
        let mut huge_watermark = 0;
        for i in (0..nr_classes).rev() {
            let size = size_of(i);
            // An object larger than a page (a large unit's) may take a chain of up to four
            // times its fewest pages: its zspage's tail then wastes ~2 % of it, where the
            // chain size's 8 pages waste ~6 % for 8-20 KiB objects. The shortest chain
            // wasting at most 3 % is taken, so a class's one partly filled zspage (what a
            // small device pays per class in use) stays as small as it can. A page-sized
            // table has no such class, so the kernel's layout is untouched.
            // Above a unit less a page, one object a zspage of its fewest pages (as the
            // unit's own class): such a class would save under a page per object, so its
            // lengths are stored raw (merged into the unit's class below), and no zspage of
            // several near-unit objects waits to be filled.
            let pages = if i < small_indexes || size > max_object - page_size {
                rule.pages_per_zspage(size, page_size, chain_size)
            } else {
                let fewest = size.div_ceil(page_size);
                let most = chain_size.max(LARGE_CHAIN_FACTOR * fewest);
                (fewest..=most)
                    .find(|&n| (n * page_size) % size * 100 <= n * page_size * 3)
                    .unwrap_or_else(|| rule.pages_per_zspage(size, page_size, most))
            };
            let objs = pages * page_size / size;
            // The kernel's rule. With one-page zspages (chain size 1, below the kernel's
            // Kconfig range of 4..16) it never fires and the kernel would call every size
            // huge; here the largest size that shares a page is the watermark instead.
            let kernel_rule = pages != 1 && objs != 1;
            let one_page_chains = chain_size == 1 && objs != 1;
            if i < small_indexes && (kernel_rule || one_page_chains) && huge_watermark == 0 {
                huge_watermark = size;
            }
            if let Some(prev) = descending.last() {
                if prev.pages_per_zspage == pages && prev.objs_per_zspage == objs {
                    index_to_desc[i] = descending.len() - 1;
                    continue;
                }
            }
            descending.push(ClassSpec {
                index: i,
                size,
                pages_per_zspage: pages,
                objs_per_zspage: objs,
                huge: objs == 1 && (pages == 1 || size == pages * page_size),
            });
            index_to_desc[i] = descending.len() - 1;
        }
        if large_indexes > 0 {
            // Lengths whose class is the largest object's are stored raw: the unit costs
            // the same, and reads need no decompression.
            huge_watermark = descending
                .iter()
                .filter(|c| c.size < max_object)
                .map(|c| c.size)
                .max()
                .expect("classes below the largest object");
        }
        let n = descending.len();
        descending.reverse();
        let slot_of_index = index_to_desc.iter().map(|&d| (n - 1 - d) as u16).collect();
        ClassTable {
            page_size,
            chain_size,
            rule,
            max_object,
            small_indexes,
            classes: descending,
            slot_of_index,
            huge_watermark,
            huge_class_size: huge_watermark - (ZS_HANDLE_SIZE - 1),
        }
    }

    /// Number of kernel class indexes (255 at 4 KiB pages).
    pub fn nr_indexes(&self) -> usize {
        self.slot_of_index.len()
    }

    /// The kernel's `get_size_class_index()`: the class index for an object of `size` bytes
    /// (handle header included).
    pub fn size_class_index(&self, size: usize) -> usize {
        let delta = self.page_size >> CLASS_BITS;
        if size > self.page_size && self.max_object > self.page_size {
            let large_delta = self.max_object >> CLASS_BITS;
            let idx = self.small_indexes + (size - self.page_size).div_ceil(large_delta) - 1;
            return idx.min(self.nr_indexes() - 1);
        }
        let idx = if size > ZS_MIN_ALLOC_SIZE {
            (size - ZS_MIN_ALLOC_SIZE).div_ceil(delta)
        } else {
            0
        };
        idx.min(self.nr_indexes() - 1)
    }

    /// Position in [`classes`](Self::classes) of the class serving a request of `len` bytes
    /// (before the handle header is added), as `zs_malloc()` picks it.
    pub fn slot_for_request(&self, len: usize) -> usize {
        self.slot_of_index[self.size_class_index(len + ZS_HANDLE_SIZE)] as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique(chain: usize, rule: ChainRule) -> (usize, usize, usize) {
        let t = ClassTable::new(4096, chain, rule);
        (t.classes.len(), t.huge_watermark, t.huge_class_size)
    }

    #[test]
    fn todays_kernel_tables() {
        assert_eq!(unique(4, ChainRule::LeastWaste), (69, 3264, 3257));
        assert_eq!(unique(8, ChainRule::LeastWaste), (119, 3632, 3625));
        assert_eq!(unique(16, ChainRule::LeastWaste), (192, 3840, 3833));
    }

    #[test]
    fn one_page_chains_have_a_watermark() {
        // Below the kernel's range: every zspage is one page, and half a page is the
        // largest size two objects share (the kernel would store every page raw).
        assert_eq!(unique(1, ChainRule::LeastWaste).1, 2048);
        assert_eq!(unique(1, ChainRule::LeastWaste).2, 2041);
        assert_eq!(
            unique(2, ChainRule::LeastWaste).1,
            2720,
            "the kernel's rule from 2 on"
        );
    }

    #[test]
    fn seed_patch_tables() {
        assert_eq!(unique(4, ChainRule::UsedPercent).0, 69);
        assert_eq!(unique(8, ChainRule::UsedPercent).0, 123);
        assert_eq!(unique(16, ChainRule::UsedPercent).0, 191);
        assert_eq!(unique(8, ChainRule::UsedPercent).1, 3632);
    }

    #[test]
    fn layout_of_4k_pages() {
        let t = ClassTable::new(4096, 8, ChainRule::LeastWaste);
        assert_eq!(t.nr_indexes(), 255);
        assert_eq!(t.classes.first().unwrap().size, 32);
        let last = t.classes.last().unwrap();
        assert_eq!((last.index, last.size, last.huge), (254, 4096, true));
        // Objects just below huge_class_size fit the watermark class; from it on, huge.
        assert_eq!(t.classes[t.slot_for_request(3624)].size, 3632);
        assert!(t.classes[t.slot_for_request(3625)].huge);
        assert!(t.classes[t.slot_for_request(4096)].huge);
        assert_eq!(t.classes[t.slot_for_request(1)].size, 32);
    }

    #[test]
    fn layout_of_16k_pages() {
        let t = ClassTable::new(16384, 8, ChainRule::LeastWaste);
        assert_eq!(t.nr_indexes(), 257);
        assert_eq!(t.classes.last().unwrap().size, 16384);
        assert!(t
            .classes
            .iter()
            .all(|c| c.size % 64 == 32 || c.size == 16384));
    }

    #[test]
    fn a_page_as_the_largest_object_is_the_kernels_table() {
        for chain in [1, 4, 8, 16] {
            let kernel = ClassTable::new(4096, chain, ChainRule::LeastWaste);
            let same = ClassTable::with_max_object(4096, chain, ChainRule::LeastWaste, 4096);
            let sizes = |t: &ClassTable| -> Vec<_> {
                t.classes
                    .iter()
                    .map(|c| (c.index, c.size, c.pages_per_zspage, c.huge))
                    .collect()
            };
            assert_eq!(sizes(&kernel), sizes(&same));
            assert_eq!(kernel.huge_class_size, same.huge_class_size);
        }
    }

    #[test]
    fn multi_page_classes_up_to_64k() {
        let t = ClassTable::with_max_object(4096, 8, ChainRule::LeastWaste, 65536);
        let kernel = ClassTable::new(4096, 8, ChainRule::LeastWaste);
        // The page's classes are the kernel's, unchanged, below the multi-page ones.
        assert_eq!(
            t.classes[..kernel.classes.len()]
                .iter()
                .map(|c| c.size)
                .collect::<Vec<_>>(),
            kernel.classes.iter().map(|c| c.size).collect::<Vec<_>>()
        );
        let last = t.classes.last().unwrap();
        assert_eq!(
            (last.size, last.pages_per_zspage, last.huge),
            (65536, 16, true)
        );
        // A whole unit lands in the unit's class; one byte less than the watermark does not.
        assert_eq!(t.classes[t.slot_for_request(65536)].size, 65536);
        assert_eq!(t.classes[t.slot_for_request(t.huge_class_size)].size, 65536);
        assert!(t.classes[t.slot_for_request(t.huge_class_size - 1)].size < 65536);
        assert_eq!(
            t.huge_watermark, 61440,
            "15 pages: the largest class saving a page per object against the unit"
        );
        // Large classes chain up to four times their fewest pages: tails waste little.
        for c in t.classes.iter().filter(|c| c.size > 4096 && !c.huge) {
            let tail = c.pages_per_zspage * 4096 - c.objs_per_zspage * c.size;
            assert!(
                tail * 100 <= c.pages_per_zspage * 4096 * 10,
                "class {}: {tail} bytes of {} pages wasted",
                c.size,
                c.pages_per_zspage
            );
        }
        // Every class holds its objects in its chain, and a request lands in a class that
        // fits it with its header.
        for c in &t.classes {
            assert!(
                c.objs_per_zspage >= 1 && c.size * c.objs_per_zspage <= c.pages_per_zspage * 4096
            );
        }
        for len in [4089, 4100, 5000, 20000, 40000, 61000] {
            let c = &t.classes[t.slot_for_request(len)];
            assert!(
                c.size >= len + ZS_HANDLE_SIZE || (c.huge && c.size >= len),
                "{len}"
            );
        }
        assert!(t.classes.len() < 512, "a handle names its class in 9 bits");
    }
}

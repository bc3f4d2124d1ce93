//! zsmalloc against the kernel's own figures: allocating objects of exactly the sizes the
//! kernel's zram stored for each corpus page (`corpus/ksizes`) must use exactly the pages the
//! kernel reported (`mem_used_total` in `NAME.truth.json`), after the write, after
//! discarding every odd page, and after compaction (with `pages_compacted`).
//!
//! Needs `../shared/corpus` (or `ZTIER_CORPUS_DIR`); says so and skips when it is absent.

use std::path::PathBuf;

use ztier_corpus::Truth;
use ztier_pool::{Handle, ZPool, ZsConfig, ZsPool};

fn corpus_dir() -> Option<PathBuf> {
    ztier_corpus::shared_corpus_dir()
}

/// The `mm_stat` fields this test compares.
#[derive(serde::Deserialize)]
struct PoolFigures {
    mem_used_total: u64,
    pages_compacted: u64,
}

#[test]
fn pages_used_equal_kernel_mem_used_total() {
    let Some(dir) = corpus_dir() else { return };
    let mut checked = 0;
    for entry in std::fs::read_dir(dir.join("ksizes")).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_owned();
        let Some(stem) = file.strip_suffix(".ksizes.u16") else {
            continue;
        };
        let (name, alg) = stem.split_once('.').unwrap();
        let truth: Truth<PoolFigures> =
            Truth::read(&dir.join(format!("{name}.truth.json"))).unwrap();
        let kernel = &truth.zram[alg];
        let bytes = std::fs::read(&path).unwrap();
        let sizes: Vec<usize> = bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]) as usize)
            .collect();

        let pool = ZsPool::new(ZsConfig::default()).unwrap();
        let payload = vec![0x5au8; 4096];
        let handles: Vec<Option<Handle>> = sizes
            .iter()
            .map(|&len| (len > 0).then(|| pool.store(&payload[..len]).unwrap()))
            .collect();
        let used = pool.total_pages() * 4096;
        assert_eq!(
            used, kernel.mm_stat.mem_used_total,
            "{name}/{alg}: after write"
        );

        checked += 1;
        // Not every algorithm's truth has the discard experiment (lzo's has none).
        let Some(exp) = &kernel.discard_odd_pages_then_compact else {
            continue;
        };
        for h in handles.iter().skip(1).step_by(2).flatten() {
            pool.free(*h).unwrap();
        }
        let used = pool.total_pages() * 4096;
        assert_eq!(
            used, exp.after_discard.mem_used_total,
            "{name}/{alg}: after discard"
        );
        pool.compact();
        assert_eq!(
            pool.total_pages() * 4096,
            exp.after_compact.mem_used_total,
            "{name}/{alg}: after compact"
        );
        assert_eq!(
            pool.pages_compacted(),
            exp.after_compact.pages_compacted,
            "{name}/{alg}: pages_compacted"
        );
        pool.compact();
        assert_eq!(
            pool.total_pages() * 4096,
            exp.after_second_compact.mem_used_total,
            "{name}/{alg}: after second compact"
        );
    }
    assert!(checked >= 6, "only {checked} corpus/algorithm pairs found");
}

//! The whole device against the kernel's zram: writing each corpus page by page in order
//! with lzo-rle, lzo and lz4 (chain size 8) gives the kernel's `mm_stat` after the write,
//! after discarding every odd page, and after compacting twice, field for field.
//! Needs the shared corpus; says so and skips without it. Under CI every (corpus, algorithm)
//! pair the truth files list must be compared.

use ztier_compress::Algorithm;
use ztier_corpus::{corpus_files, require_pairs, shared_corpus_dir, zram_truth_pairs, Corpus};
use ztier_pool::{ZsConfig, ZsPool};
use ztier_zram::{Device, MmStat};

#[test]
fn mm_stat_equals_the_kernels() {
    let Some(dir) = shared_corpus_dir() else {
        return;
    };
    let files = corpus_files(&dir);
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    let listed = zram_truth_pairs(&dir, false).unwrap();
    assert!(!listed.is_empty(), "no truth file in {}", dir.display());
    let mut compared = Vec::new();
    for path in files {
        let corpus = Corpus::load(&path).unwrap();
        let truth = corpus.truth::<MmStat>().unwrap().expect("truth file");
        for alg in ["lzo-rle", "lzo", "lz4"] {
            let what = format!("{}/{alg}", corpus.name);
            let k = truth
                .zram
                .get(alg)
                .unwrap_or_else(|| panic!("{what}: the truth file has no figures"));
            compared.push((corpus.name.clone(), alg.to_owned()));
            let pool = ZsPool::new(ZsConfig::default()).unwrap();
            let dev = Device::new(
                corpus.bytes().len() as u64,
                alg.parse::<Algorithm>().unwrap(),
                Box::new(pool),
            )
            .unwrap();
            for (i, page) in corpus.chunks(4096).enumerate() {
                dev.write_page(i as u64, page).unwrap();
            }
            assert_eq!(dev.mm_stat(), k.mm_stat, "{what}: after write");
            let Some(exp) = &k.discard_odd_pages_then_compact else {
                dev.compact();
                assert_eq!(
                    dev.mm_stat(),
                    k.mm_stat_after_compact,
                    "{what}: after compact"
                );
                continue;
            };
            for i in (1..corpus.pages() as u64).step_by(2) {
                dev.discard_page(i).unwrap();
            }
            assert_eq!(dev.mm_stat(), exp.after_discard, "{what}: after discard");
            dev.compact();
            assert_eq!(dev.mm_stat(), exp.after_compact, "{what}: after compact");
            dev.compact();
            assert_eq!(
                dev.mm_stat(),
                exp.after_second_compact,
                "{what}: second compact"
            );
        }
    }
    require_pairs("mm_stat_equals_the_kernels", &listed, &compared);
}

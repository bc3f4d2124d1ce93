//! Compressed sizes against the kernel's: for every page of every corpus, lz4 and lzo-rle
//! give exactly the size the kernel's zram stored (`ksizes`: 0 for same-filled pages, 4096
//! at or above huge_class_size, else the compressed length), and the per-corpus sums for
//! lzo-rle, lzo and lz4 equal `compr_data_size` in the truth file. Every page round-trips
//! through every algorithm.
//! lz4 output also decodes with liblz4, and liblz4's output with ztier's decoder.
//! Needs the shared corpus; says so and skips without it. Under CI every (corpus, algorithm)
//! pair the truth files list must be compared, per page where they name a `ksizes` file.

use ztier_compress::{liblz4, same_filled, worst_case_len, Algorithm};
use ztier_corpus::{corpus_files, require_pairs, shared_corpus_dir, zram_truth_pairs, Corpus};

/// zram's huge_class_size at chain size 8.
const HUGE_CLASS_SIZE: usize = 3625;

fn stored_size(page: &[u8], comp_len: usize) -> usize {
    if same_filled(page).is_some() {
        0
    } else if comp_len >= HUGE_CLASS_SIZE {
        page.len()
    } else {
        comp_len
    }
}

/// The one `mm_stat` field this test compares.
#[derive(serde::Deserialize)]
struct ComprDataSize {
    compr_data_size: u64,
}

#[test]
fn sizes_equal_the_kernels() {
    let Some(dir) = shared_corpus_dir() else {
        return;
    };
    let files = corpus_files(&dir);
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    let listed = zram_truth_pairs(&dir, false).unwrap();
    let listed_per_page = zram_truth_pairs(&dir, true).unwrap();
    assert!(!listed.is_empty(), "no truth file in {}", dir.display());
    let (mut compared, mut compared_per_page) = (Vec::new(), Vec::new());
    for path in files {
        let corpus = Corpus::load(&path).unwrap();
        let truth = corpus
            .truth::<ComprDataSize>()
            .unwrap()
            .expect("truth file");
        for alg in ["lzo-rle", "lzo", "lz4"] {
            let pair = (corpus.name.clone(), alg.to_owned());
            let kernel = truth
                .zram
                .get(alg)
                .unwrap_or_else(|| panic!("{}/{alg}: the truth file has no figures", corpus.name))
                .mm_stat
                .compr_data_size;
            let mut c = alg.parse::<Algorithm>().unwrap().new_compressor();
            // A missing `ksizes` file leaves its pair out of `compared_per_page`, which
            // `require_pairs` then names (under CI: fails) when the truth file lists it.
            let ksizes = corpus.kernel_sizes(alg).unwrap();
            if ksizes.is_some() {
                compared_per_page.push(pair.clone());
            }
            let mut comp = vec![0u8; worst_case_len(4096)];
            let mut back = vec![0u8; 4096];
            let mut total = 0u64;
            let mut mismatches = Vec::new();
            for (i, page) in corpus.chunks(4096).enumerate() {
                let n = c.compress(page, &mut comp).unwrap();
                assert_eq!(c.decompress(&comp[..n], &mut back).unwrap(), 4096);
                assert!(
                    back == page,
                    "{}/{alg}: page {i} does not round-trip",
                    corpus.name
                );
                let size = stored_size(page, n);
                total += size as u64;
                if let Some(k) = &ksizes {
                    if k[i] as usize != size && mismatches.len() < 5 {
                        mismatches.push((i, size, k[i]));
                    }
                }
            }
            assert!(
                mismatches.is_empty(),
                "{}/{alg}: (page, ztier, kernel) {mismatches:?}",
                corpus.name
            );
            assert_eq!(total, kernel, "{}/{alg}: compr_data_size", corpus.name);
            compared.push(pair);
        }
    }
    require_pairs("sizes_equal_the_kernels", &listed, &compared);
    require_pairs(
        "sizes_equal_the_kernels, page by page",
        &listed_per_page,
        &compared_per_page,
    );
}

#[test]
fn lz4_interoperates_with_liblz4() {
    let Some(dir) = shared_corpus_dir() else {
        return;
    };
    let path = corpus_files(&dir).into_iter().next().unwrap();
    let corpus = Corpus::load(&path).unwrap();
    let mut ours = "lz4".parse::<Algorithm>().unwrap().new_compressor();
    let mut comp = vec![0u8; worst_case_len(4096)];
    let mut back = vec![0u8; 4096];
    for page in corpus.chunks(4096).step_by(7) {
        let n = ours.compress(page, &mut comp).unwrap();
        assert_eq!(liblz4::decompress_safe(&comp[..n], &mut back), Some(4096));
        assert_eq!(back, page);
        let n = liblz4::compress_default(page, &mut comp).unwrap();
        assert_eq!(ours.decompress(&comp[..n], &mut back).unwrap(), 4096);
        assert_eq!(back, page);
    }
}

#[test]
fn every_other_algorithm_round_trips_every_page() {
    let Some(dir) = shared_corpus_dir() else {
        return;
    };
    let files = corpus_files(&dir);
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    for path in files {
        let corpus = Corpus::load(&path).unwrap();
        let corpus = &corpus;
        // lz4, lzo and lzo-rle round-trip every page in `sizes_equal_the_kernels`.
        std::thread::scope(|s| {
            for alg in ["lz4hc", "zstd", "zstd:level=1", "deflate", "lz4:level=4"] {
                s.spawn(move || {
                    let mut c = alg.parse::<Algorithm>().unwrap().new_compressor();
                    let mut comp = vec![0u8; worst_case_len(4096)];
                    let mut back = vec![0u8; 4096];
                    for (i, page) in corpus.chunks(4096).enumerate() {
                        let n = c.compress(page, &mut comp).unwrap();
                        assert_eq!(
                            c.decompress(&comp[..n], &mut back).unwrap(),
                            4096,
                            "{alg} page {i}"
                        );
                        assert!(
                            back == page,
                            "{}/{alg}: page {i} does not round-trip",
                            corpus.name
                        );
                    }
                });
            }
        });
    }
}

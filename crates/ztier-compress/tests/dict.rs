//! zstd dictionaries (`zstd:dict=PATH`): trained on real pages, loaded through the
//! algorithm's name, shared by streams, smaller output on pages like the training ones, and
//! clear errors for bad files and other algorithms.

use std::path::PathBuf;

use ztier_compress::{dict, same_filled, worst_case_len, Algorithm, Kind};
use ztier_corpus::Corpus;

fn sample_pages() -> Vec<Vec<u8>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst");
    let corpus = Corpus::load(&path).unwrap();
    corpus
        .bytes()
        .chunks_exact(4096)
        .filter(|p| same_filled(p).is_none())
        .map(<[u8]>::to_vec)
        .collect()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-dict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn total_size(alg: &Algorithm, pages: &[Vec<u8>]) -> usize {
    let mut c = alg.new_compressor();
    let mut d = alg.new_compressor();
    let mut out = vec![0; worst_case_len(4096)];
    let mut back = vec![0; 4096];
    pages
        .iter()
        .map(|p| {
            let n = c.compress(p, &mut out).unwrap();
            assert_eq!(d.decompress(&out[..n], &mut back).unwrap(), 4096);
            assert_eq!(&back, p, "round trip");
            n
        })
        .sum()
}

#[test]
fn a_trained_dictionary_round_trips_and_shrinks_similar_pages() {
    let pages = sample_pages();
    // Train on the even pages, measure on the odd ones: pages like, not the same as, those
    // the dictionary saw.
    let train: Vec<&[u8]> = pages.iter().step_by(2).map(Vec::as_slice).collect();
    let test: Vec<Vec<u8>> = pages.iter().skip(1).step_by(2).cloned().collect();
    let bytes = dict::train(&train, 32 << 10).unwrap();
    assert!(!bytes.is_empty() && bytes.len() <= 32 << 10);
    let path = temp("sample.dict");
    std::fs::write(&path, &bytes).unwrap();

    let name = format!("zstd:dict={}", path.display());
    let with: Algorithm = name.parse().unwrap();
    assert_eq!(with.to_string(), name);
    assert_eq!(with.dict.as_ref().unwrap().len(), bytes.len());
    let plain = Algorithm::new(Kind::Zstd);
    let (a, b) = (total_size(&plain, &test), total_size(&with, &test));
    assert!(
        (b as f64) < 0.95 * a as f64,
        "with a dictionary {b} bytes, without {a}"
    );

    // A level goes with the dictionary, in either order.
    let leveled: Algorithm = format!("zstd:dict={},level=7", path.display())
        .parse()
        .unwrap();
    assert_eq!(leveled.level, Some(7));
    assert_eq!(leveled.dict.as_ref().unwrap().level(), 7);
    assert_eq!(
        leveled.to_string(),
        format!("zstd:level=7,dict={}", path.display())
    );
    total_size(&leveled, &test[..50]);
}

#[test]
fn bad_dictionaries_are_refused_with_their_reason() {
    let missing = temp("missing.dict");
    let err = format!("zstd:dict={}", missing.display())
        .parse::<Algorithm>()
        .unwrap_err();
    assert!(err.to_string().contains("missing.dict"), "{err}");

    let empty = temp("empty.dict");
    std::fs::write(&empty, b"").unwrap();
    let err = format!("zstd:dict={}", empty.display())
        .parse::<Algorithm>()
        .unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");

    let err = "lz4:dict=/etc/hostname".parse::<Algorithm>().unwrap_err();
    assert!(err.to_string().contains("supported for zstd"), "{err}");
}

#[test]
fn a_page_compressed_with_one_dictionary_does_not_decode_as_another() {
    let pages = sample_pages();
    let first: Vec<&[u8]> = pages.iter().take(400).map(Vec::as_slice).collect();
    let last: Vec<&[u8]> = pages.iter().rev().take(400).map(Vec::as_slice).collect();
    let (a, b) = (temp("a.dict"), temp("b.dict"));
    std::fs::write(&a, dict::train(&first, 16 << 10).unwrap()).unwrap();
    std::fs::write(&b, dict::train(&last, 16 << 10).unwrap()).unwrap();
    let alg_a: Algorithm = format!("zstd:dict={}", a.display()).parse().unwrap();
    let alg_b: Algorithm = format!("zstd:dict={}", b.display()).parse().unwrap();
    assert_ne!(alg_a, alg_b);
    let mut out = vec![0; worst_case_len(4096)];
    let n = alg_a
        .new_compressor()
        .compress(&pages[0], &mut out)
        .unwrap();
    let mut back = vec![0; 4096];
    // Another dictionary: an error or other bytes, never a panic; never the page itself.
    match alg_b.new_compressor().decompress(&out[..n], &mut back) {
        Ok(_) => assert_ne!(back, pages[0]),
        Err(e) => assert!(e.to_string().contains("zstd"), "{e}"),
    }
}

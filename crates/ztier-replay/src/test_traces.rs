//! Test-only: the corpus pages and the trace files the replay tests make by hand. No locks.

use ztier_corpus::trace::{Epoch, Trace, TraceWriter};
use ztier_corpus::writer::CorpusWriter;
use ztier_corpus::{Corpus, CORPUS_PAGE};

/// A page that compresses (half a counter pattern, half zeros) and tells its content number
/// by its words.
pub(crate) fn content(n: u32) -> Vec<u8> {
    let mut p = vec![0u8; CORPUS_PAGE];
    for (i, w) in p.chunks_exact_mut(8).enumerate().take(CORPUS_PAGE / 16) {
        w.copy_from_slice(&(u64::from(n) << 32 | i as u64).to_le_bytes());
    }
    p
}

/// Writes a corpus of `pages` pages (`content(0..pages)`) at `corpus_path` and `epochs` as
/// its trace beside it, and reads both back.
pub(crate) fn written(
    corpus_path: &std::path::Path,
    pages: u32,
    epochs: &[Epoch],
) -> (Corpus, Trace) {
    let mut cw = CorpusWriter::create(corpus_path).unwrap();
    for n in 0..pages {
        cw.push(&content(n)).unwrap();
    }
    cw.finish().unwrap();
    let mut tw = TraceWriter::create(&Trace::path_for(corpus_path)).unwrap();
    for e in epochs {
        tw.write_epoch(e).unwrap();
    }
    tw.finish().unwrap();
    (
        Corpus::load(corpus_path).unwrap(),
        Trace::read(&Trace::path_for(corpus_path)).unwrap(),
    )
}

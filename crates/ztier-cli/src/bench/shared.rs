//! What every front of `ztier bench` shares: the flags of a replay ([`ReplayArgs`]: the
//! corpora, the compressors, JSON or text, the bound on a corpus), the bundled sample, and
//! the rows under a comparison with the kernel's figures.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use ztier_compress::Algorithm;
use ztier_corpus::Corpus;
use ztier_replay::zram::FieldComparison;

/// The flags every front takes.
#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Corpus file (raw .pages or .pages.zst); repeatable. Default: the bundled sample.
    #[arg(long = "corpus", value_name = "PATH")]
    pub corpora: Vec<PathBuf>,
    /// Compressor, with optional parameters (lzo-rle, lzo, lz4, lz4hc, zstd, deflate,
    /// zstd:level=N, ...); repeatable.
    #[arg(long = "compressor", value_name = "ALG", default_value = "lzo-rle")]
    pub compressors: Vec<Algorithm>,
    /// Print one JSON object per run instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Refuse a corpus of more than this many bytes of pages (K, M, G suffixes). Default: a
    /// quarter of this machine's memory (the bench holds the pages, their compressed copies
    /// and the device).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub max_corpus: Option<u64>,
}

impl ReplayArgs {
    /// The corpora named, or the bundled sample.
    pub fn paths(&self) -> anyhow::Result<Vec<PathBuf>> {
        if self.corpora.is_empty() {
            Ok(vec![default_corpus()?])
        } else {
            Ok(self.corpora.clone())
        }
    }

    /// The corpus at `path`, refused past `--max-corpus`.
    pub fn load(&self, path: &Path) -> anyhow::Result<Corpus> {
        let max = self
            .max_corpus
            .unwrap_or_else(|| ztier_pool::physical_memory_bytes() / 4);
        Corpus::load_at_most(path, max).with_context(|| format!("loading {}", path.display()))
    }
}

/// The bundled sample: next to the working directory, or in the source tree.
pub fn default_corpus() -> anyhow::Result<PathBuf> {
    let candidates = [
        PathBuf::from("samples/sample.pages.zst"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst"),
    ];
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .context("no --corpus given and the bundled samples/sample.pages.zst is not here")
}

/// One row of a comparison with the kernel: ztier's figure, the kernel's, the difference.
pub fn print_field(name: &str, f: &FieldComparison) {
    let diff = f.ztier as i128 - f.kernel as i128;
    let mark = if f.compared { "" } else { "  (not compared)" };
    println!(
        "    {name:<30} {:>14} {:>14} {diff:>+10}{mark}",
        f.ztier, f.kernel
    );
}

/// The notes under a comparison, and its verdict.
pub fn print_verdict(fields: &[FieldComparison], notes: &[String], equal: bool) {
    for note in notes {
        println!("    note: {note}");
    }
    println!(
        "    {}",
        if !equal {
            "DIFFERENT from the kernel's figures"
        } else if fields.iter().all(|f| f.compared) {
            "every field equal to the kernel's"
        } else {
            "every compared field equal to the kernel's"
        }
    );
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

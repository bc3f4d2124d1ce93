//! What the fronts of `ztier bench` share: the flags of every replay ([`ReplayArgs`]: the
//! corpora, the compressors, JSON or text, the bound on a corpus) and of those through a
//! pool ([`PoolArgs`]: zram's and zswap's), the bundled sample and a corpus's trace, a run
//! printed or written as JSON, and the lines of a report more than one front prints.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use ztier_compress::Algorithm;
use ztier_corpus::trace::Trace;
use ztier_corpus::Corpus;
use ztier_pool::ZsConfig;
use ztier_replay::trace::CorpusPages;
use ztier_replay::zram::FieldComparison;

use crate::classes::PoolLayoutArgs;
use crate::error::CliError;
use crate::pools::AllocatorChoice;

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
    /// and the device). With --trace (through zram, its far tier or zswap), a corpus past it
    /// is read on from its file, an epoch's pages at a time, instead (the largest epoch's
    /// must fit within it).
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
        Corpus::load_at_most(path, self.max_corpus())
            .map_err(|cause| CliError::Corpus { cause }.into())
    }

    /// `--max-corpus`, or a quarter of the memory.
    fn max_corpus(&self) -> u64 {
        self.max_corpus
            .unwrap_or_else(|| ztier_pool::physical_memory_bytes() / 4)
    }

    /// The corpus at `path` that `trace` names its pages in: read whole within
    /// `--max-corpus`, or read on from its file past it (said on stderr), an epoch's pages
    /// held at a time, each epoch's within `--max-corpus`.
    pub fn trace_corpus(&self, path: &Path, trace: &Trace) -> anyhow::Result<TraceCorpus> {
        let max = self.max_corpus();
        let page = ztier_corpus::CORPUS_PAGE as u64;
        let gib = |bytes: u64| bytes as f64 / f64::from(1 << 30);
        let bytes = trace.corpus_pages().saturating_mul(page);
        if bytes <= max {
            match Corpus::load_at_most(path, max) {
                Ok(corpus) => return Ok(TraceCorpus::Whole(corpus)),
                // Longer than the trace names (pages past it are never read): read on.
                Err(ztier_corpus::CorpusError::TooLarge { .. }) => {}
                Err(cause) => return Err(CliError::Corpus { cause }.into()),
            }
        }
        let default = if self.max_corpus.is_none() {
            ", a quarter of the memory"
        } else {
            ""
        };
        // Read on, the corpus holds one epoch's pages at a time: the largest must fit.
        let largest = trace
            .epochs
            .iter()
            .enumerate()
            .map(|(n, e)| (n, (e.appeared.len() + e.changed.len()) as u64 * page))
            .max_by_key(|&(_, bytes)| bytes);
        if let Some((epoch, epoch_bytes)) = largest.filter(|&(_, bytes)| bytes > max) {
            anyhow::bail!(
                "{}: epoch {epoch} writes {:.2} GiB of pages, past --max-corpus ({:.2} GiB{default}); \
                 a corpus read on from its file holds one epoch's pages at a time: give \
                 --max-corpus {}M or more",
                path.display(),
                gib(epoch_bytes),
                gib(max),
                epoch_bytes.div_ceil(1 << 20)
            );
        }
        eprintln!(
            "ztier: {}: its trace names {:.1} GiB of pages, past --max-corpus ({:.1} GiB{default}): \
             read on from the file as the epochs come to them",
            path.display(),
            gib(bytes),
            gib(max),
        );
        Ok(TraceCorpus::Streamed {
            path: path.to_owned(),
            max_held_bytes: max,
        })
    }
}

/// A trace's corpus, as [`ReplayArgs::trace_corpus`] gives it.
pub enum TraceCorpus {
    Whole(Corpus),
    Streamed { path: PathBuf, max_held_bytes: u64 },
}

impl TraceCorpus {
    pub fn pages(&self) -> CorpusPages<'_> {
        match self {
            TraceCorpus::Whole(corpus) => CorpusPages::Whole(corpus),
            TraceCorpus::Streamed {
                path,
                max_held_bytes,
            } => CorpusPages::Streamed {
                path,
                max_held_bytes: *max_held_bytes,
            },
        }
    }
}

/// The flags of a front whose pages go through a pool (zram, zswap).
#[derive(Args, Debug, Clone)]
pub struct PoolArgs {
    /// Allocator under the device or the cache (or `all`).
    #[arg(long, default_value = "zsmalloc")]
    pub allocator: AllocatorChoice,
    #[command(flatten)]
    pub layout: PoolLayoutArgs,
    /// Threads storing and loading at once; a list (`1,2`) runs each count in turn.
    #[arg(long, value_delimiter = ',', default_value = "1",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Vec<u16>,
}

impl PoolArgs {
    /// The pool layout the flags give, checked.
    pub fn layout(&self) -> anyhow::Result<ZsConfig> {
        let layout = self.layout.config();
        layout.validate().map_err(anyhow::Error::msg)?;
        Ok(layout)
    }
}

/// The trace beside the corpus at `path` (`--trace`).
pub fn read_trace(path: &Path) -> anyhow::Result<Trace> {
    let trace_path = Trace::path_for(path);
    Trace::read(&trace_path).with_context(|| {
        format!(
            "--trace: reading {} (made by ztier capture beside its corpus)",
            trace_path.display()
        )
    })
}

/// A run: as one line of JSON, or as `print` reports it.
pub fn emit<T: Serialize>(json: bool, run: &T, print: impl Fn(&T)) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(run)?);
    } else {
        print(run);
    }
    Ok(())
}

/// A store and a load's speeds, each beside the raw compressor's (or decompressor's) on the
/// same pages and threads.
pub fn print_speeds(store: (f64, f64, f64), load: (f64, f64, f64)) {
    println!(
        "  store {:>8.1} MB/s  = {:.2}x raw compress ({:.1} MB/s)",
        store.0, store.1, store.2
    );
    println!(
        "  load  {:>8.1} MB/s  = {:.2}x raw decompress ({:.1} MB/s), every page verified",
        load.0, load.1, load.2
    );
}

/// A trace replay's columns every front has: the epoch, when, and its pages present,
/// appeared, changed, gone and read back; each with its width.
const EPOCH_COLUMNS: [(&str, usize); 7] = [
    ("epoch", 5),
    ("at s", 7),
    ("present", 8),
    ("appeared", 8),
    ("changed", 8),
    ("went", 8),
    ("read back", 9),
];

/// The head of a trace replay's table: [`EPOCH_COLUMNS`], then the front's own.
pub fn print_epoch_head(front: &[(&str, usize)]) {
    let heads: String = EPOCH_COLUMNS
        .iter()
        .chain(front)
        .map(|(head, width)| format!(" {head:>width$}"))
        .collect();
    println!(" {heads}");
}

/// A row of that table: the epoch, its second, its five page counts (present, appeared,
/// changed, went, read back), then the front's `figures` under its columns `front`.
pub fn print_epoch_row(
    (epoch, seconds): (usize, f64),
    pages: [u64; 5],
    front: &[(&str, usize)],
    figures: &[u64],
) {
    let mut row = format!("  {epoch:>5} {seconds:>7.1}");
    let widths = EPOCH_COLUMNS[2..]
        .iter()
        .chain(front)
        .map(|&(_, width)| width);
    for (value, width) in pages.iter().chain(figures).zip(widths) {
        row += &format!(" {value:>width$}");
    }
    println!("{row}");
}

/// Where the Debian package installs the bundled sample.
const INSTALLED_SAMPLE: &str = "/usr/share/ztier/samples/sample.pages.zst";

/// The bundled sample: next to the working directory, where the package installs it, or in
/// the source tree this binary was built from.
pub fn default_corpus() -> anyhow::Result<PathBuf> {
    let candidates = [
        PathBuf::from("samples/sample.pages.zst"),
        PathBuf::from(INSTALLED_SAMPLE),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst"),
    ];
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "no --corpus given and the bundled sample is not here (samples/sample.pages.zst, \
             {INSTALLED_SAMPLE}): pass --corpus a corpus `ztier capture` wrote"
            )
        })
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

//! `ztier train-dict`: a zstd dictionary for zram's `zstd:dict=PATH`, trained on corpus
//! pages.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use ztier_compress::dict;
use ztier_corpus::Corpus;

use crate::size::parse_size;

#[derive(Args, Debug)]
pub struct TrainDictArgs {
    /// Pages to train on (`.pages.zst`, raw 4096-byte pages): memory like what the device
    /// will hold. Several may be given.
    #[arg(long, value_name = "PATH", required = true)]
    pub corpus: Vec<PathBuf>,
    /// The dictionary's largest size (K, M suffixes).
    #[arg(long, value_parser = parse_size, default_value = "64K")]
    pub size: u64,
    /// At most this many bytes of pages are sampled, evenly, from the corpora.
    #[arg(long, value_parser = parse_size, default_value = "32M")]
    pub sample: u64,
    /// Where to write the dictionary.
    #[arg(long, short, value_name = "PATH")]
    pub out: PathBuf,
}

pub fn run(args: &TrainDictArgs) -> anyhow::Result<()> {
    let corpora = args
        .corpus
        .iter()
        .map(|p| Corpus::load(p).with_context(|| format!("reading {}", p.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pages: Vec<&[u8]> = corpora.iter().flat_map(|c| c.chunks(4096)).collect();
    let max_len = usize::try_from(args.size).context("--size")?;
    let sample = usize::try_from(args.sample).context("--sample")?;
    let bytes = dict::train_on_pages(&pages, max_len, sample)?;
    std::fs::write(&args.out, &bytes).with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "{}: {} bytes, trained on {} pages of {}; use it as --compressor zstd:dict={}",
        args.out.display(),
        bytes.len(),
        pages.len(),
        args.corpus
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        args.out.display()
    );
    Ok(())
}

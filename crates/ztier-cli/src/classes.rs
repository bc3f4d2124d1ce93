//! `ztier classes`: the size-class table of an empty zsmalloc pool.

use clap::Args;
use serde::Serialize;
use ztier_pool::zsmalloc::{ClassSpec, ClassTable, ZsConfig};
use ztier_pool::ChainRule;

/// The zsmalloc pool layout, shared by every command that makes a pool.
#[derive(Args, Debug, Clone)]
pub struct PoolLayoutArgs {
    /// Max pages per zspage (CONFIG_ZSMALLOC_CHAIN_SIZE).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u8).range(1..=16))]
    pub chain_size: u8,
    /// Pool page size in bytes.
    #[arg(long, default_value_t = 4096, value_parser = parse_page_size)]
    pub page_size: usize,
    /// How each class's chain length is chosen: least-waste (today's kernel) or
    /// used-percent (the 2022 seed patch).
    #[arg(long, default_value = "least-waste")]
    pub chain_rule: ChainRule,
}

impl PoolLayoutArgs {
    pub fn config(&self) -> ZsConfig {
        ZsConfig {
            page_size: self.page_size,
            chain_size: self.chain_size as usize,
            chain_rule: self.chain_rule,
            max_object: None,
        }
    }
}

fn parse_page_size(s: &str) -> Result<usize, String> {
    match s {
        "4096" | "4k" | "4K" => Ok(4096),
        "16384" | "16k" | "16K" => Ok(16384),
        _ => Err(format!(
            "'{s}' is not a supported page size (4096 or 16384)"
        )),
    }
}

#[derive(Args, Debug)]
pub struct ClassesArgs {
    #[command(flatten)]
    pub layout: PoolLayoutArgs,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct ClassesReport<'a> {
    chain_size: usize,
    page_size: usize,
    chain_rule: &'static str,
    class_indexes: usize,
    unique_classes: usize,
    huge_watermark: usize,
    huge_class_size: usize,
    classes: Vec<ClassRow<'a>>,
}

#[derive(Serialize)]
struct ClassRow<'a> {
    #[serde(flatten)]
    spec: &'a ClassSpec,
    /// Kernel class indexes merged into this one.
    merged_indexes: usize,
}

pub fn run(args: &ClassesArgs) -> anyhow::Result<()> {
    let config = args.layout.config();
    config.validate().map_err(anyhow::Error::msg)?;
    let table = ClassTable::new(config.page_size, config.chain_size, config.chain_rule);
    let mut prev_index = None;
    let rows: Vec<ClassRow> = table
        .classes
        .iter()
        .map(|spec| {
            let merged = spec.index - prev_index.map_or(0, |p: usize| p + 1) + 1;
            prev_index = Some(spec.index);
            ClassRow {
                spec,
                merged_indexes: merged,
            }
        })
        .collect();
    let report = ClassesReport {
        chain_size: table.chain_size,
        page_size: table.page_size,
        chain_rule: table.rule.name(),
        class_indexes: table.nr_indexes(),
        unique_classes: table.classes.len(),
        huge_watermark: table.huge_watermark,
        huge_class_size: table.huge_class_size,
        classes: rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        " {:>5} {:>5} {:>16} {:>15} {:>6} {:>6}",
        "class", "size", "pages_per_zspage", "objs_per_zspage", "merged", "huge"
    );
    for row in &report.classes {
        let s = row.spec;
        println!(
            " {:>5} {:>5} {:>16} {:>15} {:>6} {:>6}",
            s.index,
            s.size,
            s.pages_per_zspage,
            s.objs_per_zspage,
            row.merged_indexes,
            if s.huge { "yes" } else { "" }
        );
    }
    println!(
        "\n{} unique classes of {} (page size {}, chain size {}, rule {}); \
         huge watermark {} B, huge_class_size {} B",
        report.unique_classes,
        report.class_indexes,
        report.page_size,
        report.chain_size,
        report.chain_rule,
        report.huge_watermark,
        report.huge_class_size
    );
    Ok(())
}

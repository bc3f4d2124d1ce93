//! DESIGN.md's table of what each crate may import is held to the crates' manifests: every
//! `ztier-*` dependency of a crate's library is one its row allows, none is one its row
//! forbids, and every crate has a row.

use std::collections::BTreeSet;
use std::path::Path;

/// The crates' short names, as the table writes them.
const SHORT: [&str; 16] = [
    "base",
    "pool",
    "compress",
    "blockdev",
    "swap",
    "zram",
    "zswap",
    "nbd",
    "corpus",
    "replay",
    "cli",
    "reference",
    "capture",
    "uffd",
    "vhost",
    "host",
];

/// The short crate names a table cell names (whole words only: "zswap" is not "swap").
fn named(cell: &str) -> BTreeSet<&'static str> {
    let words: BTreeSet<String> = cell
        .split(|c: char| !c.is_ascii_alphanumeric())
        .map(str::to_ascii_lowercase)
        .collect();
    SHORT
        .iter()
        .copied()
        .filter(|s| words.contains(*s))
        .collect()
}

/// The `ztier-*` crates in a manifest's `[dependencies]` (not dev- or build-dependencies).
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut in_deps = false;
    let mut deps = BTreeSet::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps {
            if let Some(name) = line
                .split(['=', ' ', '.'])
                .next()
                .and_then(|n| n.strip_prefix("ztier-"))
            {
                deps.insert(name.to_string());
            }
        }
    }
    deps
}

#[test]
fn every_crate_imports_only_what_design_md_allows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let design = std::fs::read_to_string(root.join("DESIGN.md")).unwrap();
    let mut rows = 0;
    let mut seen = BTreeSet::new();
    for line in design.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `ztier-x` | may use | must not use |
        let [_, krate, may, must_not, ..] = cells.as_slice() else {
            continue;
        };
        let Some(short) = krate
            .strip_prefix("`ztier-")
            .and_then(|k| k.strip_suffix('`'))
        else {
            continue;
        };
        rows += 1;
        seen.insert(short.to_string());
        let manifest = root.join(format!("crates/ztier-{short}/Cargo.toml"));
        let manifest = std::fs::read_to_string(&manifest)
            .unwrap_or_else(|e| panic!("DESIGN.md names ztier-{short}, but {manifest:?}: {e}"));
        let allowed = named(may);
        let forbidden = named(must_not);
        for dep in dependencies(&manifest) {
            let every = may.contains("every ztier crate");
            assert!(
                every || allowed.contains(dep.as_str()),
                "ztier-{short} imports ztier-{dep}, which DESIGN.md's table does not allow it \
                 (may use: {may})"
            );
            assert!(
                !forbidden.contains(dep.as_str()),
                "ztier-{short} imports ztier-{dep}, which DESIGN.md's table forbids it"
            );
        }
    }
    assert!(rows > 0, "DESIGN.md's import table was not found");
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let short = name.strip_prefix("ztier-").unwrap_or(&name);
        assert!(
            seen.contains(short),
            "crates/{name} has no row in DESIGN.md's import table"
        );
    }
}

#[test]
fn the_table_reader_reads_what_it_should() {
    assert_eq!(
        named("base, pool, compress, blockdev (to implement it), swap (places)"),
        ["base", "blockdev", "compress", "pool", "swap"].into()
    );
    assert_eq!(named("zram, NBD"), ["nbd", "zram"].into());
    assert!(!named("zswap only").contains("swap"));
    let manifest = "[dependencies]\nztier-base = { path = \"x\" }\nztier-pool.workspace = true\n\
                    serde = \"1\"\n[dev-dependencies]\nztier-zram = { path = \"y\" }\n";
    assert_eq!(
        dependencies(manifest),
        ["base".to_string(), "pool".to_string()].into()
    );
}

//! The pictures of a budget that sizes itself: `ztier bench uffd --lookups SECONDS --plot`
//! on the bundled sample draws each self-sized run over time and the savings/slowdown curve
//! with every run named; `ztier plot` draws the same picture from the `--json` line; a
//! judgement that is not one the bench could have written is refused, saying what is wrong,
//! with no picture and no panic. Nothing here is timed.

use std::path::Path;
use std::process::{Command, Output};

mod common;

fn ztier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(args)
        .output()
        .expect("run ztier")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `ztier plot JSON -o SVG` on `judgement`, written to `dir/NAME.json`.
fn plot(dir: &Path, name: &str, judgement: &serde_json::Value) -> (Output, std::path::PathBuf) {
    let json = dir.join(format!("{name}.json"));
    let svg = dir.join(format!("{name}.svg"));
    std::fs::write(&json, format!("{judgement}\n")).unwrap();
    let o = ztier(&["plot", json.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    (o, svg)
}

/// The name a run has on the picture, as the bench's JSON gives its budget.
fn run_name(budget: &serde_json::Value) -> String {
    let percent = |share: f64| {
        let text = format!("{:.3}", share * 100.0);
        format!("{} %", text.trim_end_matches('0').trim_end_matches('.'))
    };
    if budget == "Unlimited" {
        "every page".to_string()
    } else if let Some(share) = budget["Fixed"].as_f64() {
        format!("fixed {}", percent(share))
    } else {
        let target = budget["Autosized"]
            .as_f64()
            .expect("a budget the bench writes");
        format!("self-sized, stall target {}", percent(target))
    }
}

#[test]
fn a_lookups_judgement_is_drawn_and_a_malformed_one_refused() {
    let dir = common::temp_dir("lookups-plot");
    let direct = dir.join("direct.svg");
    // The bundled sample (no --corpus), the default stall target (1 %).
    let o = ztier(&[
        "bench",
        "uffd",
        "--lookups",
        "2",
        "--compressor",
        "lz4",
        "--json",
        "--plot",
        direct.to_str().unwrap(),
    ]);
    if !o.status.success()
        && stderr(&o).contains("userfaultfd is not permitted")
        && std::env::var_os("CI").is_none()
    {
        eprintln!("skipped: {}", stderr(&o));
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one judgement: {stdout}");
    let judgement: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    let runs = judgement["runs"].as_array().unwrap();
    // Every page, ten fixed budgets, one self-sized run.
    assert_eq!(runs.len(), 12, "{judgement}");

    let svg = std::fs::read_to_string(&direct).unwrap();
    // Each run's point on the curve named (a text element of its own: the fixed budgets by
    // their share alone), the self-sized run in its panels' captions too; the panels over
    // time and their target lines are there.
    for run in runs {
        let name = run_name(&run["budget"]);
        let point = name.strip_prefix("fixed ").unwrap_or(&name);
        assert!(
            svg.contains(&format!("\n{point}\n")),
            "{name} not on the picture"
        );
    }
    for said in [
        "sample: self-sized, stall target 1 %, budget and resident pages over time",
        "the share of each second a lookup waited on the region",
        "memory saved against slowdown",
        "budget (pages)",
        "resident pages",
        "pace (lookups per reference fold), % of every page",
        "stall target 1 %",
        "slowdown target 1 %",
    ] {
        assert!(svg.contains(said), "{said:?} not on the picture");
    }
    if let Some(oracle) = judgement["oracle"].as_u64() {
        let name = run_name(&runs[oracle as usize]["budget"]);
        assert!(
            svg.contains(&format!("oracle: {name}")),
            "the oracle unmarked"
        );
        assert!(svg.contains(&format!("oracle ({name}): resident pages")));
    }
    // No phase lengths in the result: no phase lines.
    assert!(!svg.contains("a phase begins"));

    // `ztier plot` on the JSON line draws the same picture, byte for byte.
    let (o, replot) = plot(&dir, "replot", &judgement);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&replot).unwrap(), svg);

    // A result that says how long its phases were and how long the warm-up was: each
    // phase's start within the measured seconds is drawn (four seconds, a phase a second).
    let mut phased = judgement.clone();
    phased["phase_seconds"] = 1.into();
    phased["warmup_seconds"] = 0.into();
    let self_run = phased["self_sized"][0]["run"].as_u64().unwrap() as usize;
    let first = phased["runs"][self_run]["seconds"][0].clone();
    let four: Vec<serde_json::Value> = (0..4)
        .map(|at| {
            let mut s = first.clone();
            s["at"] = at.into();
            s
        })
        .collect();
    phased["runs"][self_run]["seconds"] = four.into();
    let (o, drawn) = plot(&dir, "phased", &phased);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read_to_string(&drawn)
        .unwrap()
        .contains("a phase begins"));

    // A result from before the machine's speed was taken beside the lookups (no pace
    // anywhere): drawn in lookups a second.
    let mut unpaced = judgement.clone();
    unpaced
        .as_object_mut()
        .unwrap()
        .remove("baseline_lookups_per_reference_fold");
    for run in unpaced["runs"].as_array_mut().unwrap() {
        run.as_object_mut()
            .unwrap()
            .remove("lookups_per_reference_fold");
        for second in run["seconds"].as_array_mut().unwrap() {
            second
                .as_object_mut()
                .unwrap()
                .remove("reference_folds_per_s");
        }
    }
    let (o, drawn) = plot(&dir, "unpaced", &unpaced);
    assert!(o.status.success(), "{}", stderr(&o));
    let drawn = std::fs::read_to_string(&drawn).unwrap();
    assert!(drawn.contains("lookups/s, % of every page"));
    assert!(!drawn.contains("pace (lookups per reference fold)"));

    // Malformed judgements: each refused with its reason, exit status 1, no picture.
    let broken = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut j = judgement.clone();
        edit(&mut j);
        j
    };
    let cases: [(serde_json::Value, &[&str]); 10] = [
        (
            broken(&|j| {
                j.as_object_mut().unwrap().remove("runs");
            }),
            &[
                "lookups judgement",
                "cannot be read",
                "missing field `runs`",
            ],
        ),
        (
            broken(&|j| j["runs"][1]["seconds"][0]["stall_ppm"] = (-5).into()),
            &["lookups judgement", "cannot be read"],
        ),
        (
            broken(&|j| j["oracle"] = 99.into()),
            &["its oracle, run 99 of 12, is not a fixed budget"],
        ),
        (
            broken(&|j| j["self_sized"][0]["run"] = 1.into()),
            &["names run 1 of 12, not a self-sized run"],
        ),
        (
            broken(&|j| j["runs"][0]["lookups_per_s"] = 0.into()),
            &["every-page run's throughput", "not a measured figure"],
        ),
        (
            broken(&|j| j["baseline_lookups_per_s"] = 0.into()),
            &["every-page run's throughput", "not a measured figure"],
        ),
        (
            broken(&|j| j["baseline_lookups_per_reference_fold"] = 0.into()),
            &["the baseline's pace (0) is not a measured figure"],
        ),
        (
            // Every run at an infinite share of a baseline next to nothing: refused, not
            // drawn on an axis without end.
            broken(&|j| j["baseline_lookups_per_reference_fold"] = 1e-308.into()),
            &["has no pace, or one out of range, beside the baseline's"],
        ),
        (
            broken(&|j| {
                j["runs"][3]
                    .as_object_mut()
                    .unwrap()
                    .remove("lookups_per_reference_fold");
            }),
            &["has no pace, or one out of range, beside the baseline's"],
        ),
        (
            broken(&|j| {
                j["runs"] = serde_json::json!([]);
                j["oracle"] = serde_json::Value::Null;
                j["self_sized"] = serde_json::json!([]);
            }),
            &[
                "sample: no runs",
                "not a judgement of `ztier bench uffd --lookups",
            ],
        ),
    ];
    for (n, (bad, said)) in cases.iter().enumerate() {
        let (o, svg) = plot(&dir, &format!("bad{n}"), bad);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "case {n}: {err}");
        assert!(!err.contains("panicked"), "case {n}: {err}");
        for s in *said {
            assert!(err.contains(s), "case {n}: {s:?} not in {err}");
        }
        assert!(!svg.exists(), "case {n}: a picture was drawn");
    }

    // --plot is a flag of --lookups: without it the parser refuses it, before any work.
    let o = ztier(&[
        "bench",
        "uffd",
        "--plot",
        dir.join("x.svg").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--lookups"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

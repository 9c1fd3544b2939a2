//! `corofuse bench switch`: the runtime's per-operation costs, as JSON; the cases and
//! their kernels are [`crate::switch`]'s.
//!
//! Time is the median of several runs, taken in rounds: each round runs every case once, so
//! a slow moment of a shared, noisy machine falls on all the cases of its round, and each
//! ratio is the median of the ratios within rounds. With `--callgrind`, each case also runs
//! under `valgrind --tool=callgrind` at two iteration counts; the difference of the two
//! instruction totals divided by the difference of the counts is the cost of one iteration,
//! free of setup, and the same on every run.

use std::path::PathBuf;
use std::process::Command;

use crate::switch::{
    default_cases, default_iters, live_count, map_count_needed, measure_rounds, median_ratio,
    run_case, CaseResult, CASES,
};
use serde::Serialize;

#[derive(clap::Args)]
pub struct Args {
    /// Only these cases (default: all).
    #[arg(long = "case", value_parser = clap::builder::PossibleValuesParser::new(CASES))]
    cases: Vec<String>,
    /// Rounds (one timed run of every case each); the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Iterations per run (default: a per-case count of about 0.1-0.5 s).
    #[arg(long)]
    iters: Option<u64>,
    /// Also count instructions per iteration with valgrind's callgrind.
    #[arg(long)]
    callgrind: bool,
    /// Run one case once with `--iters` and print nothing (used under callgrind).
    #[arg(long, hide = true)]
    raw: bool,
}

#[derive(Serialize)]
struct Report {
    cases: Vec<CaseResult>,
    ratios: Ratios,
}

/// The comparisons the runtime is judged by, computed within this run.
#[derive(Serialize)]
struct Ratios {
    /// One-way switch through the runtime's loop over a raw corosensei one-way switch.
    runtime_switch_over_raw: Option<f64>,
    /// Coroutine NOP round trip over the bare ring NOP round trip.
    nop_coroutine_over_bare: Option<f64>,
    /// The bare NOP that also touches the coroutine NOP's extra cache lines, over the bare
    /// NOP: how much of the coroutine's cost those lines alone explain.
    #[serde(skip_serializing_if = "Option::is_none")]
    nop_bare_lines_over_bare: Option<f64>,
    /// Pooled spawn-to-completion in nanoseconds (queued together: chained).
    spawn_pooled_ns: Option<f64>,
    /// Pooled spawn-to-completion one at a time (the loop resumes the worker), in ns.
    spawn_one_ns: Option<f64>,
    /// Fresh-stack spawn over pooled spawn.
    spawn_fresh_over_pooled: Option<f64>,
    /// The same comparisons in instructions (with `--callgrind`): exact and repeatable.
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<InstructionRatios>,
}

/// [`Ratios`] counted in instructions per iteration instead of time.
#[derive(Serialize)]
struct InstructionRatios {
    runtime_switch_over_raw: Option<f64>,
    nop_coroutine_over_bare: Option<f64>,
    spawn_pooled: Option<f64>,
    spawn_one: Option<f64>,
}

pub fn run(args: &Args) -> Result<(), String> {
    let cases: Vec<&str> = if args.cases.is_empty() {
        default_cases()
    } else {
        args.cases.iter().map(String::as_str).collect()
    };
    // Stacks beyond ~32k need more mappings than vm.max_map_count allows by default.
    let most_live = cases
        .iter()
        .filter_map(|c| live_count(c))
        .max()
        .unwrap_or(0);
    let _map_count = (most_live > 30_000)
        .then(|| {
            let needed = map_count_needed(most_live);
            let enough = |v: &str| v.parse::<u64>().is_ok_and(|v| v >= needed);
            let need = format!("{most_live} live coroutines (two mappings per stack)");
            let path = "/proc/sys/vm/max_map_count";
            crate::setting::Setting::ensure(path, &needed.to_string(), enough, &need)
        })
        .transpose()?;
    if args.raw {
        let iters = args.iters.ok_or("--raw needs --iters")?;
        for case in cases {
            run_case(case, iters).ok_or_else(|| format!("unknown case {case}"))?;
        }
        return Ok(());
    }
    let planned: Vec<(&str, u64)> = cases
        .iter()
        .map(|&case| (case, args.iters.unwrap_or_else(|| default_iters(case))))
        .collect();
    log::info!(
        "measuring {} cases in {} rounds (one run of each per round)",
        planned.len(),
        args.runs
    );
    let mut results = measure_rounds(&planned, args.runs).ok_or("unknown case")?;
    for result in &mut results {
        // valgrind cannot map the 60k segments of 30k stacks ("VG_N_SEGMENTS is too low").
        if args.callgrind && live_count(&result.case).is_none_or(|live| live <= 10_000) {
            result.instructions = Some(instructions_per_iter(&result.case)?);
        }
    }
    let report = Report {
        ratios: ratios(&results),
        cases: results,
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn ratios(results: &[CaseResult]) -> Ratios {
    let find = |case: &str| results.iter().find(|r| r.case == case);
    let ns = |case: &str| find(case).map(|r| r.ns_per_iter);
    // Within each round, then the median: a slow moment slows both cases of its round.
    let ratio = |a: &str, b: &str| Some(median_ratio(find(a)?, find(b)?));
    let ins = |case: &str| find(case)?.instructions;
    let ins_ratio = |a: &str, b: &str| Some(ins(a)? / ins(b)?);
    let instructions =
        results
            .iter()
            .any(|r| r.instructions.is_some())
            .then(|| InstructionRatios {
                runtime_switch_over_raw: ins_ratio("runtime_switch", "raw_switch"),
                nop_coroutine_over_bare: ins_ratio("nop_coroutine", "nop_bare"),
                spawn_pooled: ins("spawn_pooled"),
                spawn_one: ins("spawn_one"),
            });
    Ratios {
        runtime_switch_over_raw: ratio("runtime_switch", "raw_switch"),
        nop_coroutine_over_bare: ratio("nop_coroutine", "nop_bare"),
        nop_bare_lines_over_bare: ratio("nop_bare_lines", "nop_bare"),
        spawn_pooled_ns: ns("spawn_pooled"),
        spawn_one_ns: ns("spawn_one"),
        spawn_fresh_over_pooled: ratio("spawn_fresh", "spawn_pooled"),
        instructions,
    }
}

/// Instructions per iteration: callgrind at two iteration counts, differenced.
fn instructions_per_iter(case: &str) -> Result<f64, String> {
    // Whole rounds of the `yield_live_*` cases at both counts, so their difference is too.
    let unit = live_count(case).map_or(10_000, |live| live.max(10_000)) as u64;
    let (small, large) = (2 * unit, 6 * unit);
    let a = callgrind_total(case, small)?;
    let b = callgrind_total(case, large)?;
    Ok((b as f64 - a as f64) / (large - small) as f64)
}

fn callgrind_total(case: &str, iters: u64) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = tempfile_path(case, iters);
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&exe)
        .args(["bench", "switch", "--raw", "--case", case, "--iters"])
        .arg(iters.to_string())
        .output()
        .map_err(|e| format!("cannot run valgrind ({e}); install it: apt-get install valgrind"))?;
    if !status.status.success() {
        return Err(format!(
            "callgrind run of {case} failed: {}",
            String::from_utf8_lossy(&status.stderr)
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary: ")
                .or_else(|| l.strip_prefix("totals: "))
        })
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no instruction total in {}", out.display()))
}

fn tempfile_path(case: &str, iters: u64) -> PathBuf {
    std::env::temp_dir().join(format!(
        "corofuse-callgrind-{}-{case}-{iters}.out",
        std::process::id()
    ))
}

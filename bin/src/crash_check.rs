//! `corofuse crash-check BASE LOG`: the crash states a power loss may leave, built from a
//! write log (`corofuse mount --record-writes LOG`) over a copy of the image as it was
//! before (BASE), each checked (`backend::crash`). Exit 0 when every state passes; else
//! the seed and the smallest failing state, and exit 1.

use std::path::PathBuf;

use backend::crash::{self, CheckError, Options};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The image as it was before the log was taken (left untouched; states are built
    /// beside it, so that a backing file named relative to it is found)
    base: PathBuf,
    /// The log (`corofuse mount --record-writes LOG`)
    log: PathBuf,
    /// Random crash states per window between two flushes (besides the state that keeps
    /// every write of the window)
    #[arg(long, default_value_t = 20)]
    states: u32,
    /// Seed of the random states (the same seed gives the same states)
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Torn writes are cut at multiples of this
    #[arg(long, default_value_t = 512, value_parser = parse_sector)]
    sector: u64,
    /// Run the second `qemu-img check` (after corofuse opened the state writable and
    /// closed it) on every N-th state only (0: never)
    #[arg(long, value_name = "N", default_value_t = 1)]
    recheck_every: u32,
}

pub fn run(args: &Args) -> Result<(), String> {
    let opts = Options {
        states: args.states,
        seed: args.seed,
        sector: args.sector,
        recheck_every: args.recheck_every,
    };
    match crash::check(&args.base, &args.log, &opts) {
        Ok(report) => {
            println!("{report}");
            Ok(())
        }
        Err(e) => match *e {
            CheckError::Failed(failure) => Err(format!("{failure}")),
            CheckError::Setup(why) => Err(why),
        },
    }
}

fn parse_sector(text: &str) -> Result<u64, String> {
    match text {
        "512" => Ok(512),
        "4096" => Ok(4096),
        _ => Err("the sector is 512 or 4096".into()),
    }
}

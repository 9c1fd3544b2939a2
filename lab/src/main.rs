//! `corofuse-lab`: the measurement lab, a binary of its own so that the shipped `corofuse`
//! links none of it (see the library's docs).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = lab::Cli::parse();
    match lab::main(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corofuse-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

//! Criterion benches of corofuse's runtime (`cargo bench -p corofuse-benches`), over the
//! very kernels that `corofuse-lab bench switch` times.
//!
//! The kernels live in the lab ([`lab::switch`]), because the shipped command runs every
//! one of them; this crate re-exports them as [`switch`], so the criterion benches and
//! the examples measure exactly the code that `corofuse-lab bench switch` measures, and the
//! `corofuse` binary does not link this crate.
#![warn(missing_docs)]

pub use lab::switch;

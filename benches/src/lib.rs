//! Measurement kernels for corofuse, shared by the criterion benches (`cargo bench`) and the
//! user-facing `corofuse bench` command, so both measure exactly the same code.
//!
//! Each kernel runs a given number of iterations of one operation and returns the elapsed
//! time; setup (rings, stacks, files) happens before the clock starts.
#![warn(missing_docs)]

pub mod switch;

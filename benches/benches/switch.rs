//! Criterion benches of the runtime's costs; see `corofuse_benches::switch` for the cases.

use corofuse_benches::switch::{run_case, CASES};
use criterion::{criterion_group, criterion_main, Criterion};

fn cases(c: &mut Criterion) {
    let mut group = c.benchmark_group("runtime");
    for &case in CASES {
        group.bench_function(case, |b| {
            b.iter_custom(|iters| run_case(case, iters).expect("known case"))
        });
    }
    group.finish();
}

criterion_group!(benches, cases);
criterion_main!(benches);

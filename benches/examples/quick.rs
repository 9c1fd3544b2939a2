fn main() {
    for &case in corofuse_benches::switch::CASES {
        let r = corofuse_benches::switch::measure(
            case,
            corofuse_benches::switch::default_iters(case),
            5,
        )
        .unwrap();
        println!(
            "{:16} {:8.2} ns (min {:.2} max {:.2})",
            r.case, r.ns_per_iter, r.min_ns, r.max_ns
        );
    }
}

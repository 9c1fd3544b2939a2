fn main() {
    let case = std::env::args().nth(1).unwrap();
    let iters: u64 = std::env::args().nth(2).unwrap().parse().unwrap();
    let d = corofuse_benches::switch::run_case(&case, iters).unwrap();
    println!("{case}: {:.2} ns/iter", d.as_nanos() as f64 / iters as f64);
}

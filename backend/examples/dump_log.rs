//! Prints a write log's records, one a line: `cargo run -p corofuse-backend --example
//! dump_log LOG`.
fn main() {
    let path = std::env::args().nth(1).expect("usage: dump_log LOG");
    let file = std::fs::File::open(&path).expect("open the log");
    let log = backend::record::format::read_log(std::io::BufReader::new(file), &path)
        .expect("read the log");
    for r in &log.records {
        println!("{r} begun #{}", r.head.begun);
    }
    if let Some(why) = log.truncated {
        println!("(ends early: {why})");
    }
}

//! Speed benchmarks (filled in below).
fn main() {}

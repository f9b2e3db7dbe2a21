//! `snapfence`: the operator tool.
fn main() {}

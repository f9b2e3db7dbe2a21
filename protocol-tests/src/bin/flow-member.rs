//! One flow-runtime member as its own process, for tests that freeze, crash and restart members
//! (see `protocol_tests::member` for its arguments and the lines it prints).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    protocol_tests::member::member_main(&args)
}

//! Placeholder: filled in with criterion benches.
fn main() {}

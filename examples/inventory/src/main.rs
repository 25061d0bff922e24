//! The inventory example (work in progress).

fn main() {}

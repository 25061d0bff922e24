use lock_core::distributed_lock;

#[distributed_lock(key = "k")]
struct NotAFn;

fn main() {}

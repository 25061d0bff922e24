use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "job:<id>", on_busy = "ignore")]
async fn unknown_value(id: u32) -> Option<u32> {
    Some(id)
}

#[distributed_lock(key = "job:<id>", on_busy = skip)]
async fn not_a_string(id: u32) -> Option<u32> {
    Some(id)
}

#[distributed_lock(key = "job:<id>", skip_if_busy)]
async fn flag(id: u32) -> Option<u32> {
    Some(id)
}

#[distributed_lock(key = "job:<id>", if_busy = "skip")]
async fn typo(id: u32) -> Option<u32> {
    Some(id)
}

#[distributed_lock(key = "job:<id>", on_busy = "skip", on_busy = "skip")]
async fn twice(id: u32) -> Option<u32> {
    Some(id)
}

// Return types that cannot say "skipped".
#[distributed_lock(key = "job:<id>", on_busy = "skip")]
async fn count(id: u32) -> u32 {
    id
}

#[distributed_lock(key = "job:<id>", on_busy = "skip")]
async fn result_of_a_count(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "job:<id>", on_busy = "skip")]
async fn names(id: u32) -> Vec<String> {
    vec![id.to_string()]
}

// Without `on_busy = "skip"`, `Option` is refused with a hint to it.
#[distributed_lock(key = "job:<id>")]
async fn option_without_skip(id: u32) -> Option<u32> {
    Some(id)
}

fn main() {}

use lock_core::distributed_lock;

#[distributed_lock(key = "k:<id>")]
async fn nothing(id: u32) {
    let _ = id;
}

fn main() {}

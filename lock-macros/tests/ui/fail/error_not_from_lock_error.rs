use lock_core::distributed_lock;

#[derive(Debug)]
pub struct MyError;

#[distributed_lock(key = "k:<id>")]
async fn no_from(id: u32) -> Result<u32, MyError> {
    Ok(id)
}

fn main() {}

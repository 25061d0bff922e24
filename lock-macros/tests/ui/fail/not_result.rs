use lock_core::distributed_lock;

#[distributed_lock(key = "k:<id>")]
async fn option(id: u32) -> Option<u32> {
    Some(id)
}

#[distributed_lock(key = "k:<id>")]
async fn unit(id: u32) -> () {
    let _ = id;
}

// An alias the macro cannot see through: the type checker reports it on the return type.
type Maybe<T> = Option<T>;

#[distributed_lock(key = "k:<id>")]
async fn alias(id: u32) -> Maybe<u32> {
    Some(id)
}

fn main() {}

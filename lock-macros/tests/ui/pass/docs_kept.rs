//! Docs and visibility of a locked fn are kept: `missing_docs` is denied, and the fns are
//! public.
#![deny(missing_docs)]

use lock_core::{distributed_lock, LockError};

/// A documented free fn.
#[distributed_lock(key = "docs:<id>")]
pub async fn documented(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

/// A type with a documented locked method.
pub struct Service;

impl Service {
    /// A documented method.
    #[distributed_lock(key = "docs:method")]
    pub async fn method(&self) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {
    let _ = documented(1);
    let _ = Service.method();
}

//! Who owns a lock inside this process: the tokio task (by [`tokio::task::try_id`]); code
//! outside any task (the future driven by `block_on`, e.g. the body of `#[tokio::main]`) is
//! owned by its thread, which is where `block_on` keeps polling it.

/// The identity a lock is reentrant for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    /// The owner of the code running now.
    pub(crate) fn current() -> Self {
        tokio::task::try_id()
            .map(Self::Task)
            .unwrap_or_else(|| Self::Thread(std::thread::current().id()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_are_distinct_owners() {
        let here = Owner::current();
        assert_eq!(here, Owner::current());
        let there = tokio::spawn(async { Owner::current() }).await.unwrap();
        assert_ne!(here, there);
    }
}

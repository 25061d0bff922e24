//! [`LogBuffer`]: log output captured in memory, for tests that check what a layer or a lock
//! logged: [`LogBuffer::capture`] for this thread's logs, or hand a buffer to a
//! `tracing_subscriber::fmt()` builder with `.with_writer(move || buffer.clone())` and
//! install that with [`LogCapture::install`].

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use tracing::subscriber::{DefaultGuard, Interest};
use tracing::{Dispatch, Metadata, Subscriber};

/// Shared, growable log output: every clone writes to the same buffer.
///
/// ```
/// use std::io::Write;
///
/// let logs = lock_testkit::LogBuffer::default();
/// let mut writer = logs.clone();
/// writeln!(writer, "ERROR lock failed").unwrap();
/// assert_eq!(logs.text(), "ERROR lock failed\n");
/// ```
#[derive(Debug, Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// Captures the logs of this thread at `level` and above, without colours, until the
    /// returned guard is dropped (a current-thread runtime's tasks log through it too).
    ///
    /// ```
    /// let (logs, _capture) = lock_testkit::LogBuffer::capture(tracing::Level::ERROR);
    /// tracing::error!("lock failed");
    /// tracing::info!("not captured");
    /// assert!(logs.text().contains("ERROR") && logs.text().contains("lock failed"));
    /// assert!(!logs.text().contains("not captured"));
    /// ```
    pub fn capture(level: tracing::Level) -> (Self, LogCapture) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (logs, LogCapture::install(subscriber))
    }

    /// Everything written so far (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A subscriber installed as this thread's default by [`LogCapture::install`] (or
/// [`LogBuffer::capture`]), until dropped.
///
/// tracing asks each log call site once, process-wide, whether any subscriber wants it, and
/// while at most one subscriber exists it asks only the *registering* thread's: a sibling
/// test thread without a subscriber that reaches a call site first disables it for every
/// thread, this one's capture included, and the test sees no logs. So the capture also keeps
/// a second subscriber alive that answers "sometimes" for every site: with two, tracing asks
/// them all, and each event is then checked against the subscriber of the thread it is
/// logged on. The call sites registered before the install are asked again by it.
#[must_use = "the capture ends when this guard is dropped"]
pub struct LogCapture {
    _default: DefaultGuard,
    _anchor: Dispatch,
}

impl LogCapture {
    /// Installs `subscriber` as this thread's default subscriber.
    pub fn install(subscriber: impl Subscriber + Send + Sync + 'static) -> Self {
        let anchor = Dispatch::new(AskEveryEvent);
        Self {
            _default: tracing::subscriber::set_default(subscriber),
            _anchor: anchor,
        }
    }
}

impl std::fmt::Debug for LogCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogCapture").finish_non_exhaustive()
    }
}

/// Keeps every call site asking per event (see [`LogCapture`]); records nothing.
struct AskEveryEvent;

impl Subscriber for AskEveryEvent {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        // Never called: `enabled` is false for every span.
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {}

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One call site, reached from two threads.
    fn log_from_the_shared_site() {
        tracing::error!("from the shared call site");
    }

    /// A call site first reached, after the capture started, by a thread with no subscriber
    /// (a sibling test) still logs into the capture: with the capture's subscriber the only
    /// one, tracing would ask that thread's (none) and disable the site for every thread.
    #[test]
    fn a_call_site_registered_by_a_thread_without_a_subscriber_is_still_captured() {
        let (logs, _capture) = LogBuffer::capture(tracing::Level::ERROR);
        std::thread::spawn(log_from_the_shared_site)
            .join()
            .expect("the other thread logs");
        log_from_the_shared_site();
        assert!(
            logs.text().contains("from the shared call site"),
            "nothing captured: {:?}",
            logs.text()
        );
    }
}

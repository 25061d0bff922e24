//! [`LogBuffer`]: log output captured in memory, for tests that check what a layer or a lock
//! logged: [`LogBuffer::capture`] for this thread's logs, or hand a buffer to a
//! `tracing_subscriber::fmt()` builder with `.with_writer(move || buffer.clone())`.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

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
    /// tracing caches whether each log call site is wanted: a site that another test thread
    /// of the same binary was registering (with no subscriber) while this capture started can
    /// stay disabled for it. Call [`LogBuffer::refresh`] right before the code whose logs the
    /// test checks.
    ///
    /// ```
    /// let (logs, _guard) = lock_testkit::LogBuffer::capture(tracing::Level::ERROR);
    /// tracing::error!("lock failed");
    /// tracing::info!("not captured");
    /// assert!(logs.text().contains("ERROR") && logs.text().contains("lock failed"));
    /// assert!(!logs.text().contains("not captured"));
    /// ```
    pub fn capture(level: tracing::Level) -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Asks every log call site again whether a subscriber wants it (see
    /// [`capture`](Self::capture)).
    pub fn refresh(&self) {
        tracing::callsite::rebuild_interest_cache();
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

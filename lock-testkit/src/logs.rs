//! [`LogBuffer`]: log output captured in memory, for tests that check what a layer or a lock
//! logged (hand it to a `tracing_subscriber::fmt()` builder with
//! `.with_writer(move || buffer.clone())`).

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

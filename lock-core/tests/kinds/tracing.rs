//! The tracing spans: `lock.acquire` (key, outcome), `lock.hold` from the grant to the release
//! (key, the release's outcome; info level with `trace_holds(true)`, else debug) and
//! `lock.release` (key, outcome), seen through a fmt subscriber that logs span closes.

use crate::common;

use lock_testkit::{LogBuffer, LogCapture};
use std::time::Duration;

use common::{locker, server};
use lock_core::Locker;
use tracing_subscriber::fmt::format::FmtSpan;

/// The lines of `logs` that close a span named `name` (its own close, not a child's: the last
/// span of the line's context is `name`).
fn closed(logs: &LogBuffer, name: &str) -> Vec<String> {
    let open = format!("{name}{{");
    logs.text()
        .lines()
        .filter(|line| line.contains(": close "))
        .filter(|line| {
            let context = line.split(": ").next().unwrap_or_default();
            let last = context.rsplit("}:").next().unwrap_or_default();
            last.starts_with(&open) || last.contains(&format!(" {open}"))
        })
        .map(str::to_owned)
        .collect()
}

/// Logs of this thread (the tests' runtimes have one) at `level`, span closes included.
fn capture(level: tracing::Level) -> (LogBuffer, LogCapture) {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(move || writer.clone())
        .finish();
    (logs, LogCapture::install(subscriber))
}

#[tokio::test]
async fn acquire_hold_and_release_spans_carry_the_key_and_the_outcome() {
    let (logs, _default) = capture(tracing::Level::DEBUG);
    let server = server();
    let locker = locker(&server).await;
    let other = common::locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    assert!(other
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());
    guard.release().await.unwrap();

    let acquires = closed(&logs, "lock.acquire");
    assert_eq!(acquires.len(), 2, "{}", logs.text());
    assert!(
        acquires[0].contains("key=k") && acquires[0].contains("outcome=\"acquired\""),
        "{acquires:?}"
    );
    assert!(acquires[1].contains("outcome=\"busy\""), "{acquires:?}");
    let releases = closed(&logs, "lock.release");
    assert_eq!(releases.len(), 1, "{}", logs.text());
    assert!(
        releases[0].contains("key=k") && releases[0].contains("outcome=\"released\""),
        "{releases:?}"
    );
    // The release runs inside the hold, which ends with its outcome.
    assert!(releases[0].contains("lock.hold{"), "{releases:?}");
    let holds = closed(&logs, "lock.hold");
    assert_eq!(holds.len(), 1, "{}", logs.text());
    assert!(holds[0].contains("key=k outcome=\"released\""), "{holds:?}");
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

#[tokio::test]
async fn the_hold_span_is_at_info_level_only_with_trace_holds() {
    let (logs, _default) = capture(tracing::Level::INFO);
    let server = server();
    let quiet = locker(&server).await;
    quiet.lock("quiet").await.unwrap().release().await.unwrap();
    let traced = Locker::builder()
        .url(server.url())
        .trace_holds(true)
        .build()
        .await
        .unwrap();
    traced
        .lock("traced")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let holds = closed(&logs, "lock.hold");
    assert_eq!(holds.len(), 1, "{}", logs.text());
    assert!(
        holds[0].contains("key=traced") && holds[0].contains("outcome=\"released\""),
        "{holds:?}"
    );
    // The per-acquire detail stays at debug.
    assert!(closed(&logs, "lock.acquire").is_empty(), "{}", logs.text());
    assert!(closed(&logs, "lock.release").is_empty(), "{}", logs.text());
    common::assert_nothing_left(&server, &[&quiet, &traced]).await;
}

/// A key is user input (a request path, an order id, personal data): in the kit's logs at
/// info level and above, and in its errors, it is shown escaped (`\n`, `\u{1b}`, a doubled
/// `\`) and cut after 128 characters, so a key with a newline (`%0A` in a URL) cannot forge a
/// log line, nor a long one flood it. Before, every `key = ..` field went out raw.
#[tokio::test]
async fn keys_are_escaped_and_cut_in_logs_and_errors() {
    let (logs, _default) = LogBuffer::capture(tracing::Level::INFO);
    let server = server();
    let lease = Duration::from_millis(300);
    let holder = Locker::builder()
        .url(server.url())
        .watchdog_lease(lease)
        .build()
        .await
        .unwrap();
    let waiter = Locker::builder()
        .url(server.url())
        .watchdog_lease(lease)
        .build()
        .await
        .unwrap();
    let key = format!(
        "order:1\nINFO lock_core: forged \u{1b}[31mred\u{202e} back\\slash {}",
        "x".repeat(600)
    );
    let guard = holder.lock(key.as_str()).await.unwrap();
    let busy = waiter
        .lock(key.as_str())
        .wait(Duration::ZERO)
        .await
        .unwrap_err();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        let key = key.clone();
        async move { waiter.lock(key).wait(Duration::from_secs(5)).await }
    });
    // Held past its lease (an info line at the release) and waited on for over a second (an
    // info line at the grant).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    guard.release().await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    // Deleted behind the holder: `force unlock` (info), then `lock lost` (warn).
    assert!(holder.force_unlock(key.as_str()).await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), second.lost())
        .await
        .unwrap();
    let lost = second.release().await.unwrap_err();

    let text = logs.text();
    for needle in [
        "lock released after a long hold",
        "lock acquired after a long wait",
        "force unlock",
        "lock lost",
    ] {
        assert!(text.contains(needle), "no {needle:?} in: {text}");
    }
    let forged: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("INFO lock_core: forged") || line.starts_with("x"))
        .collect();
    assert!(forged.is_empty(), "forged log lines: {forged:?}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "control characters reached the log: {text}"
    );
    assert!(
        text.contains(r"order:1\nINFO lock_core: forged \u{1b}[31mred\u{202e} back\\slash "),
        "{text}"
    );
    for line in text.lines() {
        assert!(line.len() < 500, "a key was not cut: {line}");
    }
    for error in [busy.to_string(), lost.to_string()] {
        assert!(
            !error.contains('\n') && error.len() < 400 && error.contains(r"order:1\nINFO"),
            "{error}"
        );
    }
    drop((holder, waiter));
}

//! The binary's command line: help, clear errors for a port in use and an unreachable Redis
//! (its password never printed), and stopping gracefully (its locks given back at once on
//! SIGTERM).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn inventory() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inventory"))
}

#[test]
fn help_lists_the_options() {
    let output = inventory().arg("--help").output().expect("run");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--listen",
        "--db",
        "--redis-url",
        "--lock-prefix",
        "--drain",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn a_port_in_use_says_so() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let output = inventory()
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let addr = format!("cannot serve on 127.0.0.1:{port}");
    assert!(
        stderr.contains(&addr) && stderr.contains("in use"),
        "{stderr}"
    );
}

/// A password in `REDIS_URL` never reaches the output: the error that Redis cannot be reached
/// names the URL redacted.
#[test]
fn an_unreachable_redis_is_named_without_its_password() {
    let db = std::env::temp_dir().join(format!("inventory-no-redis-{}.db", std::process::id()));
    let output = inventory()
        .env("REDIS_URL", "redis://app:hun/ter2@127.0.0.1:1/")
        .args(["--listen", "127.0.0.1:0", "--db"])
        .arg(&db)
        .output()
        .expect("run");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    assert_eq!(output.status.code(), Some(2));
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        printed.contains("cannot reach Redis at redis://app:***@127.0.0.1:1/"),
        "{printed}"
    );
    assert!(
        !printed.contains("ter2"),
        "the password was printed: {printed}"
    );
}

/// A rolling restart: SIGTERM reaches an instance while a purchase holds its lock (a watchdog
/// lock, 30 s lease, in the middle of a 5 s "think"). The instance lets requests drain for
/// `--drain`, then shuts its locker down: the lock key is gone from Redis at once, the
/// process exits cleanly, and the next instance takes the key without waiting, instead of a
/// lease later.
#[test]
fn sigterm_gives_the_instances_locks_back_at_once() {
    let redis = lock_testkit::RedisServer::start().expect("start redis-server");
    let db = std::env::temp_dir().join(format!("inventory-sigterm-{}.db", std::process::id()));
    let port = lock_testkit::free_port();
    let mut instance = inventory()
        .args(["--listen", &format!("127.0.0.1:{port}"), "--db"])
        .arg(&db)
        .args(["--think", "5s", "--drain", "200ms"])
        .env("REDIS_URL", redis.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the instance");
    let mut stdout = BufReader::new(instance.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read stdout");
    assert!(line.starts_with("listening on"), "{line:?}");

    // A purchase under the macro's lock, answered only after the think.
    let purchase = std::thread::spawn(move || {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        conn.write_all(
            b"POST /skus/42/purchase/macro HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        )
        .expect("send");
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer);
        answer
    });
    let lock_keys = || redis.keys("lock:*:lock:inventory:42");
    let start = Instant::now();
    while lock_keys().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the purchase never locked"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    let signalled = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &instance.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    while !lock_keys().is_empty() {
        assert!(
            signalled.elapsed() < Duration::from_secs(2),
            "the lock key outlived the instance's SIGTERM by 2 s (think 5 s, lease 30 s)"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let freed = signalled.elapsed();
    let status = instance.wait().expect("wait for the instance");
    assert!(status.success(), "the instance exited with {status}");
    let answer = purchase.join().expect("the purchase thread");
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");

    // The next instance: the key is free now, not a lease later.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let next = lock_core::Locker::connect(&redis.url())
            .await
            .expect("connect");
        let guard = next
            .lock("inventory:42")
            .wait(Duration::ZERO)
            .await
            .expect("the key is free at once");
        guard.release().await.expect("release");
    });
    lock_testkit::figure(&format!(
        "inventory: lock key gone {freed:?} after SIGTERM (drain 200 ms, think 5 s, lease 30 s)"
    ));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}

//! The demo's command line: help, a clear error without Redis, and a Redis password that is
//! never printed.

use std::process::Command;

fn demo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inventory-demo"))
}

#[test]
fn help_lists_the_demo_options_and_serve() {
    let output = demo().arg("--help").output().expect("run");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--instances",
        "--stock",
        "--purchases",
        "--concurrency",
        "--variants",
        "--chaos",
        "--redis-url",
        "--report",
        "serve",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn without_redis_server_and_redis_url_it_says_how_to_install_it() {
    let empty = std::env::temp_dir().join(format!("inventory-demo-no-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("dir");
    let output = demo()
        .env("PATH", &empty)
        .env_remove("REDIS_URL")
        .arg("--quiet")
        .output()
        .expect("run");
    let _ = std::fs::remove_dir_all(&empty);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("apt-get install redis-server"), "{stderr}");
    assert!(stderr.contains("scripts/demo.sh"), "{stderr}");
}

/// A password in `REDIS_URL` never reaches the output: the error that Redis cannot be reached
/// names the URL redacted.
#[test]
fn the_redis_password_is_never_printed() {
    let output = demo()
        .env("REDIS_URL", "redis://app:hun/ter2@127.0.0.1:1/")
        .arg("--quiet")
        .output()
        .expect("run");
    assert!(!output.status.success());
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(printed.contains("cannot reach Redis at"), "{printed}");
    assert!(
        !printed.contains("ter2"),
        "the password was printed: {printed}"
    );
    assert!(
        printed.contains("redis://app:***@127.0.0.1:1/"),
        "{printed}"
    );
}

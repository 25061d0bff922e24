//! The binary's command line: help, a clear error without Redis, a clear error for a port in
//! use.

use std::process::Command;

fn inventory() -> Command {
    Command::new(env!("CARGO_BIN_EXE_inventory"))
}

#[test]
fn help_lists_the_demo_options_and_serve() {
    let output = inventory().arg("--help").output().expect("run");
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
        "serve",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn without_redis_server_and_redis_url_it_says_how_to_install_it() {
    let empty = std::env::temp_dir().join(format!("inventory-no-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("dir");
    let output = inventory()
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

#[test]
fn serve_on_a_port_in_use_says_so() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let output = inventory()
        .args(["serve", "--port", &port.to_string()])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is in use"), "{stderr}");
    assert!(stderr.contains("--port 0"), "{stderr}");
}

//! Service instances as child processes: `<exe> serve --port 0 ...`, each with its own
//! `Locker`, all on one database file and one Redis.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::demo::DemoError;
use crate::server::ServeArgs;

/// One running instance.
#[derive(Debug)]
pub(crate) struct Instance {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
    child: Child,
    /// Closing it tells the instance to shut down (it runs with `--watch-stdin`); if the demo
    /// dies, the system closes it, so no instance outlives the demo.
    stdin: Option<ChildStdin>,
}

/// The running instances; dropping them kills the processes.
#[derive(Debug, Default)]
pub(crate) struct Instances {
    pub(crate) list: Vec<Instance>,
}

impl Instances {
    /// Starts `count` instances of `exe serve` with `args` (port 0, so each binds a free port
    /// and reports it).
    pub(crate) async fn start(
        exe: &Path,
        count: usize,
        args: &ServeArgs,
    ) -> Result<Self, DemoError> {
        let mut instances = Self::default();
        for i in 1..=count {
            let name = format!("i{i}");
            let mut args = args.clone();
            args.port = 0;
            args.instance = Some(name.clone());
            args.watch_stdin = true;
            instances.list.push(start_one(exe, name, &args).await?);
        }
        Ok(instances)
    }

    /// The listening addresses.
    pub(crate) fn addrs(&self) -> Vec<SocketAddr> {
        self.list.iter().map(|i| i.addr).collect()
    }

    /// Asks every instance to stop (by closing its stdin) and waits up to 5 s, then kills the
    /// stragglers.
    pub(crate) async fn stop(mut self) {
        for instance in &mut self.list {
            instance.stdin = None;
        }
        for instance in &mut self.list {
            let exited = tokio::time::timeout(Duration::from_secs(5), instance.child.wait()).await;
            if !matches!(exited, Ok(Ok(_))) {
                tracing::warn!(instance = %instance.name, "did not stop within 5 s: killing it");
                let _ = instance.child.kill().await;
            }
        }
    }
}

async fn start_one(exe: &Path, name: String, args: &ServeArgs) -> Result<Instance, DemoError> {
    let mut command = Command::new(exe);
    command
        .arg("serve")
        .args(args.to_args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        // Only the URL chosen here, never one inherited by accident.
        .env_remove("REDIS_URL");
    if let Some((name, url)) = args.redis_url_env() {
        command.env(name, url);
    }
    if std::env::var_os("RUST_LOG").is_none() {
        // Keep the progress bar clean; RUST_LOG=info shows what the instances do.
        command.env("RUST_LOG", "error");
    }
    let mut child = command.spawn().map_err(|e| DemoError::Instance {
        name: name.clone(),
        message: format!("cannot run {}: {e}", exe.display()),
    })?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    let addr = match first {
        Ok(Ok(Some(line))) => line
            .strip_prefix("listening on http://")
            .and_then(|a| a.trim().parse::<SocketAddr>().ok()),
        _ => None,
    };
    let Some(addr) = addr else {
        let _ = child.start_kill();
        let status = child.wait().await.ok();
        return Err(DemoError::Instance {
            name,
            message: match status {
                Some(status) => format!("exited during start-up ({status}); its error is above"),
                None => "did not start".to_owned(),
            },
        });
    };
    // Nothing more is expected on stdout; drain it anyway so the instance never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(Instance {
        name,
        addr,
        child,
        stdin,
    })
}

//! Service instances as child processes: `<exe> serve --listen 127.0.0.1:0 ...` (the demo's own
//! executable, [`instance`](crate::instance)), each with its own `Locker`, all on one database
//! file and one Redis.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use inventory::ServeArgs;

use crate::demo::DemoError;

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
            args.listen.set_port(0);
            args.service.instance = name.clone();
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
        .args(command_line(args))
        .arg("--watch-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        // A command line is visible to every user of the machine (`ps`); the URL may carry a
        // password.
        .env("REDIS_URL", &args.redis_url);
    if std::env::var_os("RUST_LOG").is_none() {
        // Keep the progress bar clean; RUST_LOG=info shows what the instances do.
        command.env("RUST_LOG", "error");
    }
    let mut child = command.spawn().map_err(|e| DemoError::Instance {
        name: name.clone(),
        message: format!("cannot run {}: {e}", exe.display()),
    })?;
    let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
    let Some(stdout) = stdout else {
        let message = "started without its standard output".to_owned();
        return Err(DemoError::Instance { name, message });
    };
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

/// The arguments after `serve` that reproduce `args`, but for the Redis URL, which goes in the
/// environment: a command line is visible to every user of the machine (`ps`).
pub(crate) fn command_line(args: &ServeArgs) -> Vec<String> {
    let time = |d: std::time::Duration| humantime::format_duration(d).to_string();
    let service = &args.service;
    [
        ("--listen", args.listen.to_string()),
        ("--db", args.db.display().to_string()),
        ("--lock-prefix", args.lock_prefix.clone()),
        ("--drain", time(args.drain)),
        ("--instance", service.instance.clone()),
        ("--think", time(service.think)),
        ("--wait", time(service.wait)),
        ("--lease", time(service.lease)),
    ]
    .into_iter()
    .flat_map(|(option, value)| [option.to_owned(), value])
    .collect()
}

#[cfg(test)]
mod tests {
    use inventory::ServiceConfig;

    use super::*;

    /// The `serve` children get the Redis URL in their environment, never on their command
    /// line.
    #[test]
    fn the_redis_url_is_not_on_a_childs_command_line() {
        let args = ServeArgs {
            listen: ([127, 0, 0, 1], 0).into(),
            db: "inventory.db".into(),
            redis_url: "redis://app:hunter2@db:6379/".to_owned(),
            lock_prefix: "lock:".to_owned(),
            drain: std::time::Duration::from_secs(10),
            service: ServiceConfig {
                instance: "i1".to_owned(),
                ..ServiceConfig::default()
            },
        };
        let line = command_line(&args).join(" ");
        assert!(!line.contains("hunter2"), "{line}");
        assert!(line.contains("--instance i1 --think 5ms"), "{line}");
    }
}

//! The oversell demo, and the instances of the inventory service it runs.
//!
//! Run it from the repository root (it installs `redis-server` with apt-get if needed and
//! starts its own on a free port):
//!
//! ```sh
//! scripts/demo.sh                 # 3 instances, stock 100, 1,000 purchases per variant
//! scripts/demo.sh --chaos         # also stall lock holders past their lease
//! scripts/demo.sh --help          # every option
//! ```
//!
//! It prints a table and writes an HTML report with the timelines (default
//! `target/oversell-demo.html`, `--report PATH` to choose).
//!
//! or with cargo: `cargo run --release -p inventory-demo -- --chaos`. With `REDIS_URL` set,
//! the demo uses that Redis instead of starting one. The service on its own is the
//! `inventory` example (`cargo run --release -p inventory -- --help`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use inventory_demo::demo::{self, DemoArgs};
use inventory_demo::instance::{self, InstanceArgs};

/// Shows a Redis lock stopping an oversell: starts a redis-server, a SQLite database and
/// several instances of an inventory service, fires concurrent purchases of one SKU at them
/// for each purchase variant, and prints what each sold.
#[derive(Debug, Parser)]
#[command(
    name = "inventory-demo",
    version,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    demo: DemoArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs one instance of the inventory service as the demo does (it starts several).
    Serve(InstanceArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_log = if cli.command.is_some() {
        "warn"
    } else {
        "error"
    };
    if let Err(error) = tracing::subscriber::set_global_default(instance::subscriber(default_log)) {
        eprintln!("inventory-demo: no logs: {error}");
    }

    match cli.command {
        Some(Command::Serve(args)) => match instance::serve(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("inventory-demo serve: {error}");
                ExitCode::from(2)
            }
        },
        None => run_demo(cli.demo).await,
    }
}

async fn run_demo(args: DemoArgs) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(error) => {
            eprintln!("oversell demo: cannot find my own executable: {error}");
            return ExitCode::from(2);
        }
    };
    let config = args.into_config(exe);
    let report_path = config.report.clone();
    // Everything the demo starts lives in this future: leaving the select drops it, which
    // kills the instances and the redis-server and removes the temporary database.
    let result = tokio::select! {
        result = demo::run(&config) => result,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ninterrupted: stopped the instances and redis-server");
            return ExitCode::from(130);
        }
    };
    match result {
        Ok(report) => {
            print!("{}", report.render());
            match inventory_demo::report::write(&report, &report_path) {
                Ok(path) => println!("\nReport (timelines and charts): {}", path.display()),
                Err(error) => {
                    eprintln!("oversell demo: {error}");
                    return ExitCode::from(2);
                }
            }
            let failures = report.failures();
            if failures.is_empty() {
                ExitCode::SUCCESS
            } else {
                for row in failures {
                    eprintln!(
                        "FAILED: {} oversold by {} and sold {} units twice under a lock",
                        row.label(),
                        row.oversold(),
                        row.sold_twice()
                    );
                }
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("oversell demo: {error}");
            ExitCode::from(2)
        }
    }
}

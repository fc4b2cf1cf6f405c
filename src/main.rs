//! `setpoint`: one binary, roles as subcommands (see `setpoint --help`).

use clap::Parser;
use setpoint::cli::{Cli, run};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("SETPOINT_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let code = run(Cli::parse()).await?;
    std::process::exit(code);
}

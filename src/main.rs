//! `setpoint`: one binary, roles as subcommands (see `setpoint --help`).

use clap::Parser;
use setpoint::cli::{Cli, Command, run};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::util::SubscriberInitExt as _;

/// jemalloc rather than glibc's malloc: reconciles allocate and free many
/// short-lived JSON values across the runtime's threads, the pattern in
/// which glibc's per-thread arenas hold on to freed memory. Its effect alone
/// is not measured yet (see README, Sizing).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    // The file fills in the environment before anything else reads it, and
    // before any thread exists; then the flags are read again over it.
    if let Some(file) = cli.config.clone()
        && !matches!(cli.command, Command::Config(_))
    {
        // SAFETY: no other thread runs yet (the runtime starts below).
        if let Err(error) = unsafe { setpoint::config::apply_file(&file) } {
            eprintln!("error: {error}");
            std::process::exit(2);
        }
        cli = Cli::parse();
    }
    init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let code = runtime.block_on(run(cli))?;
    std::process::exit(code);
}

/// See `setpoint::logging`.
fn init_logging() {
    let filter = EnvFilter::try_from_env("SETPOINT_LOG").unwrap_or_else(|_| "warn".into());
    let json = std::env::var("SETPOINT_LOG_FORMAT").is_ok_and(|f| f == "json");
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // `init` also forwards the `log` records of the libraries that use it.
    setpoint::logging::subscriber(filter, json, ansi, std::io::stderr).init();
}

//! The log subscriber of both binaries: standard error, `RUST_LOG` (default `warn`), colour only for a
//! person at a terminal.

/// Whether log lines carry colour: on a terminal, unless `NO_COLOR` is set to anything non-empty.
pub fn log_colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the process's log subscriber (once, first thing in `main`).
pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: escape codes in a journal or a log file are noise
        // (issue 31), and NO_COLOR (no-color.org) turns them off anywhere.
        .with_ansi(log_colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR"),
        ))
        .init();
}

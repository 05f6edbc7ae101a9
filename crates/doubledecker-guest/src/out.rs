//! Standard output and standard error that never panic.
//!
//! `println!` panics when standard output is a pipe whose reader is gone (`doubledecker lab list |
//! head -1`): Rust ignores SIGPIPE, so the write fails with `EPIPE` and the macro turns that into a
//! panic. Every command of both binaries (`doubledecker`, which takes these macros from this crate, and
//! `doubledecker-guest`) prints through [`outln!`] / [`out!`] (and [`errln!`] for
//! standard error) instead: the first failed write marks the stream closed, later writes are dropped,
//! and the command goes on to its normal end. That is the right behaviour for all of them: the
//! long-running ones (`memctl run`, `guest watch`, `mount`, `serve`) must finish what they do (restore a
//! lowered limit, destroy their pools, unmount) whoever reads their output, and the short ones have
//! nothing left to say once nobody listens. The exit status stays that of the command.
//!
//! Invariant: nothing in either binary's crate writes to the standard streams except through this
//! module (a test, `closed_pipe`, runs every command with both streams closed).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

fn write(closed: &AtomicBool, w: &mut dyn Write, args: std::fmt::Arguments<'_>, newline: bool) {
    if closed.load(Ordering::Relaxed) {
        return;
    }
    let r = w.write_fmt(args).and_then(|()| if newline { w.write_all(b"\n") } else { Ok(()) });
    if r.and_then(|()| w.flush()).is_err() {
        // Any write error means nobody reads (a broken pipe is the usual one): stop writing.
        closed.store(true, Ordering::Relaxed);
    }
}

/// Writes to standard output; after a failed write, nothing more is written.
pub fn stdout(args: std::fmt::Arguments<'_>, newline: bool) {
    write(&STDOUT_CLOSED, &mut std::io::stdout().lock(), args, newline);
}

/// Writes to standard error; after a failed write, nothing more is written.
pub fn stderr(args: std::fmt::Arguments<'_>, newline: bool) {
    write(&STDERR_CLOSED, &mut std::io::stderr().lock(), args, newline);
}

/// `println!` that never panics (see the module documentation).
#[macro_export]
macro_rules! outln {
    () => { $crate::out::stdout(format_args!(""), true) };
    ($($t:tt)*) => { $crate::out::stdout(format_args!($($t)*), true) };
}

/// `print!` that never panics.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::stdout(format_args!($($t)*), false) };
}

/// `eprintln!` that never panics.
#[macro_export]
macro_rules! errln {
    ($($t:tt)*) => { $crate::out::stderr(format_args!($($t)*), true) };
}

//! CPU time of another process, from `/proc/<pid>/stat`: what `bench server` charges each server with
//! over its measured window (issue 16, item 1: on a 2-core machine the load generator takes half the
//! CPU, so a server's CPU time per operation is the fair measure, not its ops/s); and the machine's
//! busy and idle time from `/proc/stat`, which says whether a run had CPU left over (a server that
//! answers as fast as the load generator asks cannot show more ops/s than the client can ask for).
//!
//! Why `/proc/<pid>/stat` and not the server's threads one by one: its `utime` and `stime` are the
//! whole process's, including threads that exited during the window (a tokio blocking-pool thread,
//! memcached's LRU crawler), so nothing the server spent can slip through. Both fields are in clock
//! ticks (`sysconf(_SC_CLK_TCK)`, 100 per second on Linux): a 10 ms resolution, under 1% of the
//! second or more of CPU a server spends in a measured window of seconds.

use std::time::Duration;

/// The fields of one `/proc/<pid>/stat` (or `/proc/<pid>/task/<tid>/stat`) line that the benchmarks
/// read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Time in user mode, clock ticks (field 14 of proc(5)).
    pub utime_ticks: u64,
    /// Time in kernel mode, clock ticks (field 15).
    pub stime_ticks: u64,
    /// Nice value (field 19).
    pub nice: i64,
}

impl ProcStat {
    /// User plus system time, clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        self.utime_ticks + self.stime_ticks
    }
}

/// Parses one stat line. The command name (field 2) is in parentheses and may itself hold spaces and
/// parentheses, so the fields are counted from the last `)`. `None` when the line is cut short or a
/// field is not a number.
pub fn parse_stat(line: &str) -> Option<ProcStat> {
    let rest = line.rsplit_once(')')?.1;
    // After the name: field 3 (state) is index 0, so field n is index n - 3.
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        utime_ticks: f.get(14 - 3)?.parse().ok()?,
        stime_ticks: f.get(15 - 3)?.parse().ok()?,
        nice: f.get(19 - 3)?.parse().ok()?,
    })
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `utime` and `stime`.
pub fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name, handled below.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // USER_HZ is 100 on every Linux architecture the project builds for; a failure keeps that.
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Converts clock ticks to a duration.
pub fn ticks_to_duration(ticks: u64, ticks_per_s: u64) -> Duration {
    Duration::from_nanos((ticks as u128 * 1_000_000_000 / ticks_per_s.max(1) as u128) as u64)
}

/// User plus system CPU time the process `pid` has used so far, its exited threads included.
pub fn process_cpu(pid: u32) -> std::io::Result<Duration> {
    let line = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let s = parse_stat(&line).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("/proc/{pid}/stat: {line:?}"))
    })?;
    Ok(ticks_to_duration(s.cpu_ticks(), clock_ticks_per_s()))
}

/// The machine's CPU time so far, from the first (`cpu`) line of `/proc/stat`, all cores together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MachineCpu {
    /// Every field of the line (user, nice, system, idle, iowait, irq, softirq, steal), clock ticks;
    /// guest time is already inside user and nice, so it is not added again.
    pub total_ticks: u64,
    /// Idle and iowait: time no task could use.
    pub idle_ticks: u64,
}

/// Parses the `cpu` line of `/proc/stat` (`cpu  user nice system idle iowait irq softirq steal ...`).
pub fn parse_machine_stat(text: &str) -> Option<MachineCpu> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if f.len() < 5 {
        return None;
    }
    Some(MachineCpu { total_ticks: f.iter().take(8).sum(), idle_ticks: f[3] + f[4] })
}

/// The machine's CPU time so far (`/proc/stat`).
pub fn machine_cpu() -> std::io::Result<MachineCpu> {
    let text = std::fs::read_to_string("/proc/stat")?;
    parse_machine_stat(&text).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "/proc/stat has no parsable cpu line")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_after_a_name_with_spaces_and_parentheses() {
        // A real line of a tokio worker, its name changed to hold ") (" and spaces.
        let line = "4242 (tokio ) (wo rker) S 1 4242 4242 0 -1 4194624 1234 0 0 0 \
                    731 219 0 0 20 -5 6 0 123456 1000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1";
        let s = parse_stat(line).unwrap();
        assert_eq!(s, ProcStat { utime_ticks: 731, stime_ticks: 219, nice: -5 });
        assert_eq!(s.cpu_ticks(), 950);
    }

    #[test]
    fn refuses_a_short_or_garbled_line() {
        assert_eq!(parse_stat("4242 (x) S 1 2 3"), None);
        assert_eq!(parse_stat("no name at all"), None);
        let line = "1 (x) S 1 1 1 0 -1 0 0 0 0 0 abc 2 0 0 20 0 1 0";
        assert_eq!(parse_stat(line), None);
    }

    #[test]
    fn parses_the_machine_line_of_proc_stat() {
        let text = "cpu  100 5 50 800 20 3 7 15 0 0\ncpu0 50 2 25 400 10 1 3 7 0 0\nintr 1 2\n";
        assert_eq!(
            parse_machine_stat(text),
            Some(MachineCpu { total_ticks: 100 + 5 + 50 + 800 + 20 + 3 + 7 + 15, idle_ticks: 820 })
        );
        assert_eq!(parse_machine_stat("cpu0 1 2 3 4 5\n"), None);
        assert_eq!(parse_machine_stat("cpu  1 2 x 4 5\n"), None);
        assert!(machine_cpu().unwrap().total_ticks > 0);
    }

    #[test]
    fn ticks_convert_at_the_clock_rate() {
        assert_eq!(ticks_to_duration(250, 100), Duration::from_millis(2500));
        assert_eq!(ticks_to_duration(3, 1000), Duration::from_millis(3));
    }

    #[test]
    fn a_busy_thread_of_this_process_shows_in_its_cpu_time() {
        let pid = std::process::id();
        let before = process_cpu(pid).unwrap();
        // Spin until the kernel has charged at least 50 ms (5 ticks) more: the time is read, not
        // assumed. Bounded so that a broken reader fails instead of hanging.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut x = 0u64;
        loop {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            }
            std::hint::black_box(x);
            if process_cpu(pid).unwrap() >= before + Duration::from_millis(50) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no CPU time charged after 30 s of spinning");
        }
    }
}

//! Rough per-CPU-second speeds of the models on a synthetic trace (development aid; the benchmark is
//! `doubledecker bench mrc`).
use dd_mrc::*;
use std::time::Duration;

fn cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() {
    let n: usize = std::env::args().nth(1).map_or(10_000_000, |s| s.parse().unwrap());
    let k: u64 = std::env::args().nth(2).map_or(1_000_000, |s| s.parse().unwrap());
    let mut x = 1u64;
    let trace: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // skewed: square of a uniform
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            ((u * u * k as f64) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        })
        .collect();
    for (name, mut m) in [
        ("exact", Box::new(ExactLru::new(Unit::Pages)) as Box<dyn Mrc>),
        ("shards-0.01", Box::new(Shards::fixed_rate(0.01, Unit::Pages).unwrap())),
        ("shards-8192", Box::new(Shards::fixed_size(8192, Unit::Pages).unwrap())),
        ("shards-32768 (default)", MrcConfig::default().build().unwrap()),
    ] {
        let t = cpu();
        for chunk in trace.chunks(16 * 1024) {
            m.access_keys(chunk);
        }
        let dt = cpu() - t;
        println!("{name}: {:.2} M refs per CPU s ({:?})", n as f64 / dt.as_secs_f64() / 1e6, m.stats());
    }
}

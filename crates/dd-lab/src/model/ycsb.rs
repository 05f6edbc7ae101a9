//! YCSB core workloads A-F as request generators: the operation mix and the key chooser of each, drawn
//! as YCSB 0.17 `CoreWorkload` draws them, from a seeded ChaCha stream.
//!
//! Owns the workload table (published mixes of `workloads/workload[a-f]`), the zipfian generator of
//! Gray et al. (YCSB's `ZipfianGenerator`, constant 0.99), the scrambled zipfian
//! (`ScrambledZipfianGenerator`: a zipfian draw over 10^10 items with YCSB's precomputed zeta, hashed
//! with FNV-64 and taken modulo the item count, so the hot keys are spread over the key space), the
//! skewed-latest chooser of workload D (`SkewedLatestGenerator`: the newest record minus a zipfian
//! offset over the records inserted so far) and the uniform scan length of workload E (1..=100).
//!
//! Invariants: every key drawn is `< records()` (the records loaded plus those inserted so far); equal
//! seeds give equal streams. Keys are record numbers; which page a record lives on is the store's
//! business (`kvstore`).

use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub use crate::scenario::YcsbWorkload;

/// YCSB's `ZIPFIAN_CONSTANT`.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// Item space of the scrambled zipfian (`ScrambledZipfianGenerator.ITEM_COUNT`).
const SCRAMBLED_ITEMS: u64 = 10_000_000_000;
/// zeta(10^10, 0.99) as YCSB precomputes it (`ScrambledZipfianGenerator.ZETAN`).
const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// One request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read(u64),
    Update(u64),
    /// A new record (its key is the next record number).
    Insert(u64),
    /// `len` records from `start` in key order.
    Scan {
        start: u64,
        len: u32,
    },
    ReadModifyWrite(u64),
}

/// Proportions of read, update, insert, scan and read-modify-write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mix {
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub rmw: f64,
}

impl YcsbWorkload {
    /// The published mix (YCSB `workloads/workloada` ... `workloadf`).
    pub fn mix(self) -> Mix {
        let m = |read, update, insert, scan, rmw| Mix { read, update, insert, scan, rmw };
        match self {
            YcsbWorkload::A => m(0.5, 0.5, 0.0, 0.0, 0.0),
            YcsbWorkload::B => m(0.95, 0.05, 0.0, 0.0, 0.0),
            YcsbWorkload::C => m(1.0, 0.0, 0.0, 0.0, 0.0),
            YcsbWorkload::D => m(0.95, 0.0, 0.05, 0.0, 0.0),
            YcsbWorkload::E => m(0.0, 0.0, 0.05, 0.95, 0.0),
            YcsbWorkload::F => m(0.5, 0.0, 0.0, 0.0, 0.5),
        }
    }
    /// D draws keys from the latest records; every other workload from the scrambled zipfian.
    fn latest(self) -> bool {
        self == YcsbWorkload::D
    }
}

/// YCSB's `Utils.fnvhash64`: FNV-1 over the 8 little-endian octets, then `Math.abs`.
pub fn fnvhash64(mut val: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for _ in 0..8 {
        h ^= val & 0xff;
        h = h.wrapping_mul(1_099_511_628_211);
        val >>= 8;
    }
    (h as i64).unsigned_abs()
}

fn zeta_range(from: u64, to: u64, theta: f64) -> f64 {
    (from..to).map(|i| 1.0 / ((i + 1) as f64).powf(theta)).sum()
}

/// YCSB's `ZipfianGenerator` over `0..n` (item 0 the most popular). `n` may grow (workload D), and zeta
/// is then extended incrementally as YCSB does.
#[derive(Debug, Clone)]
pub struct Zipfian {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    zeta2: f64,
    eta: f64,
}

impl Zipfian {
    pub fn new(n: u64, theta: f64) -> Zipfian {
        Self::with_zetan(n, theta, zeta_range(0, n, theta))
    }
    fn with_zetan(n: u64, theta: f64, zetan: f64) -> Zipfian {
        let zeta2 = zeta_range(0, 2, theta);
        let mut z = Zipfian { n, theta, alpha: 1.0 / (1.0 - theta), zetan, zeta2, eta: 0.0 };
        z.eta = z.eta_of();
        z
    }
    fn eta_of(&self) -> f64 {
        (1.0 - (2.0 / self.n as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }
    /// Grows the item count (never shrinks, as YCSB without `allowitemcountdecrease`).
    pub fn grow(&mut self, n: u64) {
        if n > self.n {
            self.zetan += zeta_range(self.n, n, self.theta);
            self.n = n;
            self.eta = self.eta_of();
        }
    }
    pub fn next(&self, rng: &mut ChaCha8Rng) -> u64 {
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let v = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        v.min(self.n - 1)
    }
}

/// A seeded YCSB client: the operation mix and key choosers of one core workload over a record set
/// that starts at `records` and grows with inserts.
#[derive(Debug, Clone)]
pub struct Ycsb {
    pub workload: YcsbWorkload,
    records: u64,
    /// Key space of the scrambled zipfian: the loaded records plus the inserts YCSB expects (it sizes the
    /// chooser with `insertcount + expectednewkeys`, and redraws a key not inserted yet).
    key_space: u64,
    scrambled: Zipfian,
    latest: Option<Zipfian>,
    pub max_scan_len: u32,
}

impl Ycsb {
    /// `records` loaded; `expected_inserts` sizes the key space for D and E as YCSB's
    /// `expectednewkeys` (operation count x insert proportion x 2).
    pub fn new(workload: YcsbWorkload, records: u64, expected_inserts: u64) -> Ycsb {
        let records = records.max(1);
        Ycsb {
            workload,
            records,
            key_space: records + expected_inserts,
            scrambled: Zipfian::with_zetan(SCRAMBLED_ITEMS, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
            latest: workload.latest().then(|| Zipfian::new(records, ZIPFIAN_CONSTANT)),
            max_scan_len: 100,
        }
    }

    /// Records that exist now.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// A key as `ScrambledZipfianGenerator` draws it, redrawn while it names a record not inserted yet.
    pub fn scrambled_key(&self, rng: &mut ChaCha8Rng) -> u64 {
        loop {
            let k = fnvhash64(self.scrambled.next(rng)) % self.key_space;
            if k < self.records {
                return k;
            }
        }
    }

    fn key(&self, rng: &mut ChaCha8Rng) -> u64 {
        match &self.latest {
            // SkewedLatestGenerator: the newest record minus a zipfian offset.
            Some(z) => self.records - 1 - z.next(rng).min(self.records - 1),
            None => self.scrambled_key(rng),
        }
    }

    /// The next request.
    pub fn next_op(&mut self, rng: &mut ChaCha8Rng) -> Op {
        let m = self.workload.mix();
        let mut u: f64 = rng.gen();
        let mut pick = |p: f64| {
            let hit = u < p;
            u -= p;
            hit
        };
        if pick(m.read) {
            Op::Read(self.key(rng))
        } else if pick(m.update) {
            Op::Update(self.key(rng))
        } else if pick(m.insert) {
            let k = self.records;
            self.records += 1;
            self.key_space = self.key_space.max(self.records);
            if let Some(z) = self.latest.as_mut() {
                z.grow(self.records);
            }
            Op::Insert(k)
        } else if pick(m.scan) {
            let start = self.key(rng);
            Op::Scan { start, len: rng.gen_range(1..=self.max_scan_len) }
        } else {
            Op::ReadModifyWrite(self.key(rng))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng(seed: u64) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(seed)
    }

    #[test]
    fn fnv_matches_ycsb() {
        // Values of Java's `Utils.fnvhash64` (xor-then-multiply over 8 octets, then Math.abs), computed
        // independently with arbitrary-precision arithmetic.
        assert_eq!(fnvhash64(0), 6_284_781_860_667_377_211);
        assert_eq!(fnvhash64(12345), 1_792_800_413_050_876_852);
        assert_eq!(fnvhash64((1 << 40) + 7), 6_089_181_255_519_459_853);
    }

    #[test]
    fn zipfian_is_skewed_like_zipf_099() {
        let z = Zipfian::new(1000, ZIPFIAN_CONSTANT);
        let mut r = rng(7);
        let mut counts = vec![0u64; 1000];
        let n = 200_000;
        for _ in 0..n {
            counts[z.next(&mut r) as usize] += 1;
        }
        // P(item 0) = 1 / zeta(1000, 0.99) ~= 0.134; P(item 1) ~= 0.067.
        let p0 = counts[0] as f64 / n as f64;
        let zeta = zeta_range(0, 1000, ZIPFIAN_CONSTANT);
        assert!((p0 - 1.0 / zeta).abs() < 0.01, "p0 {p0} vs {}", 1.0 / zeta);
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
        // The 10% most popular items take well over half the requests.
        let top: u64 = counts[..100].iter().sum();
        assert!(top as f64 / n as f64 > 0.6, "top 10% got {}", top as f64 / n as f64);
    }

    #[test]
    fn streams_are_deterministic_per_seed() {
        let mut a = Ycsb::new(YcsbWorkload::A, 10_000, 0);
        let mut b = Ycsb::new(YcsbWorkload::A, 10_000, 0);
        let (mut ra, mut rb) = (rng(3), rng(3));
        let va: Vec<Op> = (0..1000).map(|_| a.next_op(&mut ra)).collect();
        let vb: Vec<Op> = (0..1000).map(|_| b.next_op(&mut rb)).collect();
        assert_eq!(va, vb);
        let mut c = Ycsb::new(YcsbWorkload::A, 10_000, 0);
        let mut rc = rng(4);
        let vc: Vec<Op> = (0..1000).map(|_| c.next_op(&mut rc)).collect();
        assert_ne!(va, vc);
    }

    #[test]
    fn scrambling_spreads_hot_keys_over_the_key_space() {
        let y = Ycsb::new(YcsbWorkload::C, 100_000, 0);
        let mut r = rng(11);
        let mut counts = std::collections::HashMap::new();
        for _ in 0..100_000 {
            *counts.entry(y.scrambled_key(&mut r)).or_insert(0u64) += 1;
        }
        let mut hot: Vec<(u64, u64)> = counts.into_iter().map(|(k, c)| (c, k)).collect();
        hot.sort_unstable_by(|a, b| b.cmp(a));
        // Still skewed: the hottest key is requested far more than the 1/100000 of a uniform draw.
        assert!(hot[0].0 > 1_000, "hottest key only {} hits", hot[0].0);
        // But the 20 hottest keys are spread over the space, not bunched at its start as plain zipfian.
        let keys: Vec<u64> = hot[..20].iter().map(|h| h.1).collect();
        assert!(keys.iter().filter(|&&k| k < 1_000).count() < 5, "hot keys bunched: {keys:?}");
        assert!(keys.iter().any(|&k| k > 50_000), "no hot key in the upper half: {keys:?}");
    }

    #[test]
    fn mixes_match_the_published_proportions() {
        for w in [YcsbWorkload::A, YcsbWorkload::B, YcsbWorkload::D, YcsbWorkload::E, YcsbWorkload::F] {
            let mut y = Ycsb::new(w, 10_000, 1_000);
            let mut r = rng(5);
            let mut c = [0u64; 5];
            let n = 20_000;
            for _ in 0..n {
                let i = match y.next_op(&mut r) {
                    Op::Read(_) => 0,
                    Op::Update(_) => 1,
                    Op::Insert(_) => 2,
                    Op::Scan { len, .. } => {
                        assert!((1..=100).contains(&len));
                        3
                    }
                    Op::ReadModifyWrite(_) => 4,
                };
                c[i] += 1;
            }
            let m = w.mix();
            for (got, want) in c.iter().zip([m.read, m.update, m.insert, m.scan, m.rmw]) {
                assert!((*got as f64 / n as f64 - want).abs() < 0.015, "{w:?}: {c:?}");
            }
        }
    }

    #[test]
    fn latest_prefers_new_records_and_keys_stay_in_range() {
        let mut y = Ycsb::new(YcsbWorkload::D, 10_000, 1_000);
        let mut r = rng(9);
        let mut recent = 0;
        let mut reads = 0;
        for _ in 0..20_000 {
            match y.next_op(&mut r) {
                Op::Read(k) => {
                    assert!(k < y.records());
                    reads += 1;
                    if k + 100 >= y.records() {
                        recent += 1;
                    }
                }
                Op::Insert(k) => assert_eq!(k + 1, y.records()),
                o => panic!("D does not {o:?}"),
            }
        }
        // Under 1% of the records, over 40% of the reads.
        assert!(recent as f64 / reads as f64 > 0.4, "{recent} of {reads}");
        assert!(y.records() > 10_500);
    }
}

//! A histogram of stack distances with weighted counts, in log-linear buckets.
//!
//! Distances below `2^sub_bits` get a bucket each; above, every power of two is split into `2^sub_bits`
//! equal buckets, so a bucket's width is at most `2^-sub_bits` of its values. Exact page curves use
//! `sub_bits = 40` (a bucket per distance for any realistic trace); sampled and byte curves use fewer,
//! which bounds the histogram at `64 x 2^sub_bits` buckets whatever the distances.
//!
//! Reading: a distance `d` is a hit in a cache of size `c` iff `d <= c`. Within a bucket `[lo, hi)` the
//! distances are taken as spread evenly over its integers, so `hits(c)` is exact at bucket boundaries
//! and linear in between.

#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    sub_bits: u32,
    counts: Vec<f64>,
}

impl Histogram {
    pub fn new(sub_bits: u32) -> Self {
        assert!(sub_bits <= 48);
        Histogram { sub_bits, counts: Vec::new() }
    }

    #[inline]
    fn index(&self, v: u64) -> usize {
        let sub = 1u64 << self.sub_bits;
        if v < sub {
            return v as usize;
        }
        let e = 63 - v.leading_zeros();
        let shift = e - self.sub_bits;
        let mantissa = (v >> shift) - sub;
        (sub + shift as u64 * sub + mantissa) as usize
    }

    /// The integer range `[lo, hi)` of bucket `idx`.
    fn bounds(&self, idx: usize) -> (u64, u64) {
        let sub = 1u64 << self.sub_bits;
        let idx = idx as u64;
        if idx < sub {
            return (idx, idx + 1);
        }
        let shift = (idx - sub) / sub;
        let m = (idx - sub) % sub;
        ((sub + m) << shift, (sub + m + 1).checked_shl(shift as u32).unwrap_or(u64::MAX))
    }

    #[inline]
    pub fn add(&mut self, distance: u64, weight: f64) {
        let i = self.index(distance);
        if i >= self.counts.len() {
            self.counts.resize(i + 1, 0.0);
        }
        self.counts[i] += weight;
    }

    /// Multiplies every count by `factor` (ageing: see `Shards::decay`).
    pub fn scale(&mut self, factor: f64) {
        for c in &mut self.counts {
            *c *= factor;
        }
    }

    /// Adds weight 1 at each of `distances`, grouped by 4,096-distance chunk first (a counting sort
    /// into `scratch`), so that a histogram far larger than the caches is updated one cache-resident
    /// chunk at a time instead of with a cache miss per distance.
    pub fn add_batch(&mut self, distances: &[u32], scratch: &mut Vec<u32>) {
        const CHUNK_BITS: u32 = 12;
        let Some(&max) = distances.iter().max() else { return };
        let mut start = vec![0u32; (max >> CHUNK_BITS) as usize + 2];
        for &d in distances {
            start[(d >> CHUNK_BITS) as usize + 1] += 1;
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        scratch.clear();
        scratch.resize(distances.len(), 0);
        for &d in distances {
            let c = &mut start[(d >> CHUNK_BITS) as usize];
            scratch[*c as usize] = d;
            *c += 1;
        }
        for &d in scratch.iter() {
            self.add(d as u64, 1.0);
        }
    }

    /// The cumulative view the curve is read from.
    pub fn cumulative(&self) -> Cumulative<'_> {
        let mut before = Vec::with_capacity(self.counts.len() + 1);
        let mut sum = 0.0;
        before.push(0.0);
        for c in &self.counts {
            sum += c;
            before.push(sum);
        }
        Cumulative { hist: self, before }
    }

    /// Bucket tops `hi - 1` of every bucket up to the last non-empty one (the natural curve sizes).
    pub fn bucket_tops(&self) -> Vec<u64> {
        let last = self.counts.iter().rposition(|&c| c != 0.0).map_or(0, |i| i + 1);
        (0..last).map(|i| self.bounds(i).1 - 1).collect()
    }
}

/// Prefix sums of a histogram.
pub(crate) struct Cumulative<'a> {
    hist: &'a Histogram,
    /// `before[i]` = sum of buckets `0..i`.
    before: Vec<f64>,
}

impl Cumulative<'_> {
    /// Weight of distances `<= size`.
    pub fn hits(&self, size: u64) -> f64 {
        let n = self.hist.counts.len();
        let i = self.hist.index(size);
        if i >= n {
            return self.before[n];
        }
        let (lo, hi) = self.hist.bounds(i);
        let frac = (size - lo + 1) as f64 / (hi - lo) as f64;
        self.before[i] + self.hist.counts[i] * frac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_integers_in_order() {
        let h = Histogram::new(3);
        let mut expect_lo = 0;
        for i in 0..200 {
            let (lo, hi) = h.bounds(i);
            assert_eq!(lo, expect_lo, "bucket {i}");
            assert!(hi > lo);
            assert!((hi - lo) as f64 <= (lo as f64 / 8.0).max(1.0), "bucket {i} too wide");
            for v in [lo, hi - 1] {
                assert_eq!(h.index(v), i, "value {v}");
            }
            expect_lo = hi;
        }
        assert_eq!(h.index(u64::MAX), h.index(u64::MAX - 1));
    }

    #[test]
    fn hits_are_exact_at_bucket_tops_and_linear_inside() {
        let mut h = Histogram::new(2);
        h.add(1, 1.0);
        h.add(9, 2.0); // bucket [8, 10)
        h.add(100, 4.0);
        let c = h.cumulative();
        assert_eq!(c.hits(0), 0.0);
        assert_eq!(c.hits(1), 1.0);
        assert_eq!(c.hits(7), 1.0);
        assert_eq!(c.hits(8), 2.0); // half of [8, 10)
        assert_eq!(c.hits(9), 3.0);
        assert_eq!(c.hits(u64::MAX), 7.0);
        assert_eq!(*h.bucket_tops().last().unwrap(), 111); // [96, 112)
    }

    #[test]
    fn add_batch_equals_adding_one_by_one() {
        let ds: Vec<u32> = (0..50_000u32).map(|i| i.wrapping_mul(2_654_435_761) % 100_000).collect();
        let (mut a, mut b) = (Histogram::new(40), Histogram::new(40));
        ds.iter().for_each(|&d| a.add(d as u64, 1.0));
        b.add_batch(&ds, &mut Vec::new());
        assert_eq!(a.counts, b.counts);
    }
}

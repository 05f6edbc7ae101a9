//! [`Curve`]: miss ratio against cache size, as points, with the readings a provisioner needs.
//!
//! Between points a curve is read linearly; beyond its last point it stays at its last miss ratio (a
//! bigger cache than any distance seen misses only first references). Invariants, checked by
//! [`Curve::new`]: at least one point, sizes strictly ascending from 0, miss ratio 1 at size 0, miss
//! ratios in `[0, 1]`.

use crate::MrcError;
use serde::{Deserialize, Serialize};

/// What a curve's sizes count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Cache slots: every key takes one, whatever its size.
    #[default]
    Pages,
    /// Bytes: a key takes its size.
    Bytes,
}

/// A miss-ratio curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    unit: Unit,
    sizes: Vec<u64>,
    miss_ratio: Vec<f64>,
}

impl Curve {
    /// A curve from its points (see the module comment for what is checked). A first point at a size
    /// above 0 gets the point `(0, 1)` put before it.
    pub fn new(unit: Unit, sizes: Vec<u64>, miss_ratio: Vec<f64>) -> Result<Curve, MrcError> {
        if sizes.len() != miss_ratio.len() {
            return Err(MrcError::invalid("miss_ratio", "one miss ratio per size"));
        }
        if sizes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(MrcError::invalid("sizes", "sizes must be strictly ascending"));
        }
        if let Some(m) = miss_ratio.iter().find(|m| !(0.0..=1.0).contains(*m)) {
            return Err(MrcError::invalid("miss_ratio", format!("{m} is not in [0, 1]")));
        }
        let (mut sizes, mut miss_ratio) = (sizes, miss_ratio);
        match sizes.first() {
            Some(0) => {
                if miss_ratio[0] != 1.0 {
                    return Err(MrcError::invalid("miss_ratio", "a cache of size 0 misses everything"));
                }
            }
            _ => {
                sizes.insert(0, 0);
                miss_ratio.insert(0, 1.0);
            }
        }
        Ok(Curve { unit, sizes, miss_ratio })
    }

    /// Builds a curve from a function of size, at `sizes` (sorted, deduplicated, 0 added), clamping
    /// values into `[0, 1]` (SHARDS_adj can overshoot slightly).
    pub(crate) fn from_fn(unit: Unit, sizes: &[u64], mut miss: impl FnMut(u64) -> f64) -> Curve {
        let mut s: Vec<u64> = sizes.to_vec();
        s.push(0);
        s.sort_unstable();
        s.dedup();
        let m = s.iter().map(|&x| if x == 0 { 1.0 } else { miss(x).clamp(0.0, 1.0) }).collect();
        Curve { unit, sizes: s, miss_ratio: m }
    }

    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// The sizes of the points, ascending, starting at 0.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    /// The miss ratios of the points.
    pub fn miss_ratios(&self) -> &[f64] {
        &self.miss_ratio
    }

    /// `(size, miss ratio)` pairs.
    pub fn points(&self) -> impl Iterator<Item = (u64, f64)> + '_ {
        self.sizes.iter().copied().zip(self.miss_ratio.iter().copied())
    }

    /// The largest size with a point.
    pub fn max_size(&self) -> u64 {
        *self.sizes.last().expect("a curve has a point")
    }

    /// The miss ratio at `size` (linear between points, flat after the last).
    pub fn miss_ratio_at(&self, size: f64) -> f64 {
        if size <= 0.0 {
            return 1.0;
        }
        let i = self.sizes.partition_point(|&s| (s as f64) <= size);
        if i == self.sizes.len() {
            return *self.miss_ratio.last().expect("a curve has a point");
        }
        // sizes[i - 1] <= size < sizes[i]; i >= 1 because sizes[0] == 0 < size.
        let (x0, x1) = (self.sizes[i - 1] as f64, self.sizes[i] as f64);
        let (y0, y1) = (self.miss_ratio[i - 1], self.miss_ratio[i]);
        y0 + (y1 - y0) * (size - x0) / (x1 - x0)
    }

    /// `1 - miss_ratio_at(size)`.
    pub fn hit_ratio_at(&self, size: f64) -> f64 {
        1.0 - self.miss_ratio_at(size)
    }

    /// The smallest size whose miss ratio is at most `target`, or `None` if no size on the curve gets
    /// there (then the target is infeasible for this workload at any cache size seen).
    pub fn size_for_miss_ratio(&self, target: f64) -> Option<f64> {
        if target >= 1.0 {
            return Some(0.0);
        }
        for i in 1..self.sizes.len() {
            let (y0, y1) = (self.miss_ratio[i - 1], self.miss_ratio[i]);
            if y1 <= target {
                let (x0, x1) = (self.sizes[i - 1] as f64, self.sizes[i] as f64);
                if y0 <= target {
                    return Some(x0);
                }
                return Some(x0 + (x1 - x0) * (y0 - target) / (y0 - y1));
            }
        }
        None
    }

    /// The curve read at other sizes (interpolated; sorted, 0 added).
    pub fn resample(&self, sizes: &[u64]) -> Curve {
        Curve::from_fn(self.unit, sizes, |s| self.miss_ratio_at(s as f64))
    }

    /// `sizes` evenly spaced: `points` sizes from `max / points` to `max` (plus 0).
    pub fn even_sizes(max: u64, points: usize) -> Vec<u64> {
        let points = points.max(1) as u64;
        let mut v: Vec<u64> =
            (1..=points).map(|i| (max as u128 * i as u128 / points as u128) as u64).collect();
        v.dedup();
        v.retain(|&s| s > 0);
        v
    }

    /// Mean absolute difference to `other` over this curve's points except size 0 (where every curve
    /// is 1): the error measure of the SHARDS paper.
    pub fn mean_absolute_error(&self, other: &Curve) -> f64 {
        let diffs: Vec<f64> =
            self.points().skip(1).map(|(s, m)| (m - other.miss_ratio_at(s as f64)).abs()).collect();
        if diffs.is_empty() {
            return 0.0;
        }
        diffs.iter().sum::<f64>() / diffs.len() as f64
    }

    /// The same curve with sizes multiplied by `factor` (pages to bytes: the page size), in `unit`.
    pub fn scaled(&self, factor: u64, unit: Unit) -> Curve {
        let mut sizes = Vec::with_capacity(self.sizes.len());
        let mut miss_ratio = Vec::with_capacity(self.sizes.len());
        for (s, m) in self.points() {
            let s = s.saturating_mul(factor);
            if sizes.last().is_some_and(|&last| last >= s) {
                continue; // saturation made two sizes equal
            }
            sizes.push(s);
            miss_ratio.push(m);
        }
        Curve { unit, sizes, miss_ratio }
    }

    /// The curve of an exclusive second-level cache behind an LRU first level of `first_level` (this
    /// curve being the LRU curve of the first level's references), in the second level's own terms: the
    /// fraction of the gets reaching it (the first level's misses) that miss it too, as a function of
    /// its size. See the crate comment for why the two levels make one LRU cache.
    pub fn behind(&self, first_level: u64) -> Curve {
        let base = self.miss_ratio_at(first_level as f64);
        if base <= 0.0 {
            // Nothing reaches the second level: it has no misses to speak of; call it all misses.
            return Curve { unit: self.unit, sizes: vec![0], miss_ratio: vec![1.0] };
        }
        let sizes: Vec<u64> =
            self.sizes.iter().filter(|&&s| s > first_level).map(|&s| s - first_level).collect();
        Curve::from_fn(self.unit, &sizes, |s| self.miss_ratio_at((first_level + s) as f64) / base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> Curve {
        Curve::new(Unit::Pages, vec![0, 10, 20, 40], vec![1.0, 0.5, 0.3, 0.3]).unwrap()
    }

    #[test]
    fn reads_interpolate_and_stay_flat_after_the_end() {
        let c = c();
        assert_eq!(c.miss_ratio_at(0.0), 1.0);
        assert_eq!(c.miss_ratio_at(5.0), 0.75);
        assert_eq!(c.miss_ratio_at(10.0), 0.5);
        assert!((c.miss_ratio_at(15.0) - 0.4).abs() < 1e-12);
        assert_eq!(c.miss_ratio_at(1e9), 0.3);
        assert_eq!(c.hit_ratio_at(10.0), 0.5);
    }

    #[test]
    fn size_for_miss_ratio_inverts_and_reports_infeasible() {
        let c = c();
        assert_eq!(c.size_for_miss_ratio(0.5), Some(10.0));
        assert!((c.size_for_miss_ratio(0.4).unwrap() - 15.0).abs() < 1e-9);
        assert_eq!(c.size_for_miss_ratio(0.3), Some(20.0));
        assert_eq!(c.size_for_miss_ratio(0.2), None);
        assert_eq!(c.size_for_miss_ratio(1.0), Some(0.0));
    }

    #[test]
    fn new_checks_its_invariants() {
        assert!(Curve::new(Unit::Pages, vec![0, 5, 5], vec![1.0, 0.5, 0.4]).is_err());
        assert!(Curve::new(Unit::Pages, vec![0, 5], vec![0.9, 0.5]).is_err());
        assert!(Curve::new(Unit::Pages, vec![5], vec![1.5]).is_err());
        let c = Curve::new(Unit::Pages, vec![5], vec![0.5]).unwrap();
        assert_eq!(c.sizes(), [0, 5]);
    }

    #[test]
    fn mae_scaled_and_behind() {
        let a = c();
        assert_eq!(a.mean_absolute_error(&a), 0.0);
        let b = Curve::new(Unit::Pages, vec![0, 10, 20, 40], vec![1.0, 0.6, 0.4, 0.3]).unwrap();
        assert!((a.mean_absolute_error(&b) - 0.2 / 3.0).abs() < 1e-12);
        let bytes = a.scaled(4096, Unit::Bytes);
        assert_eq!(bytes.sizes()[1], 40960);
        assert_eq!(bytes.miss_ratio_at(40960.0), 0.5);
        let second = a.behind(10);
        assert_eq!(second.sizes(), [0, 10, 30]);
        assert!((second.miss_ratio_at(10.0) - 0.6).abs() < 1e-12); // 0.3 of all = 0.6 of the 0.5 reaching it
        assert_eq!(Curve::even_sizes(10, 4), vec![2, 5, 7, 10]);
    }
}

//! The inverse of `arbitrary`'s decoding, for the few shapes the structure-aware targets use: a
//! [`Writer`] produces the bytes from which `arbitrary` 1.x (derive and `Unstructured`) decodes a
//! given value. The converter of recorded traffic (`examples/corpus_from_capture.rs`) writes typed
//! inputs with it.
//!
//! The layout is `arbitrary`'s, not ours, and could change with its version; so every encoder in this
//! crate is checked by decoding its output with `arbitrary` again and comparing (`roundtrip`, and the
//! unit tests), and the converter refuses to write an input that does not decode to what it meant.
//!
//! What `arbitrary` 1.5 reads: integers as little-endian bytes of their width; `bool` as a byte's
//! lowest bit; an enum's variant `i` of `n` from a `u32` `x` as `(x * n) >> 32`; `Option` as a `bool`
//! then the value; a `Vec` (not in last position) as a `true` byte before each element and a `false`
//! one after the last; a `Vec` in last position of `arbitrary_take_rest` the same without the final
//! `false` (the end of the input ends it); `Unstructured::int_in_range(a..=b)` with `b - a < 256` as
//! one byte, `a + byte % (b - a + 1)`.

/// Bytes being written for `arbitrary` to read back.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }

    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A derived enum's variant `index` of `count` (its fields follow).
    pub fn variant(&mut self, index: u32, count: u32) -> &mut Self {
        assert!(index < count, "variant {index} of {count}");
        // The smallest x with (x * count) >> 32 == index.
        let x = ((index as u64) << 32).div_ceil(count as u64);
        self.u32(x as u32)
    }

    /// `Unstructured::int_in_range(lo..=hi)` giving `v`, for ranges of at most 256 values.
    pub fn in_range(&mut self, v: u64, lo: u64, hi: u64) -> &mut Self {
        assert!(lo <= v && v <= hi && hi - lo < 256, "{v} in {lo}..={hi}");
        if lo == hi {
            return self; // one choice: nothing is read
        }
        self.u8((v - lo) as u8)
    }

    /// `Option<T>`: the flag, then the value written by `some`.
    pub fn option<T>(&mut self, v: Option<&T>, some: impl FnOnce(&mut Self, &T)) -> &mut Self {
        self.bool(v.is_some());
        if let Some(t) = v {
            some(self, t);
        }
        self
    }

    /// A `Vec<T>` that is not the last field: a continue flag before each element, a stop flag after.
    pub fn vec<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Self, &T)) -> &mut Self {
        for t in items {
            self.bool(true);
            each(self, t);
        }
        self.bool(false)
    }

    /// A `Vec<T>` read by `arbitrary_take_rest` (the last field of the input): no stop flag.
    pub fn rest_vec<T>(&mut self, items: &[T], mut each: impl FnMut(&mut Self, &T)) -> &mut Self {
        for t in items {
            self.bool(true);
            each(self, t);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbitrary::{Arbitrary, Unstructured};

    #[derive(Arbitrary, Debug, PartialEq)]
    enum E {
        A,
        B(u8),
        C { x: u16, y: bool },
        D,
        F(Option<u32>),
    }

    #[derive(Arbitrary, Debug, PartialEq)]
    struct S {
        e: E,
        v: Vec<u8>,
        n: u64,
        rest: Vec<E>,
    }

    fn write_e(w: &mut Writer, e: &E) {
        match e {
            E::A => w.variant(0, 5),
            E::B(b) => w.variant(1, 5).u8(*b),
            E::C { x, y } => w.variant(2, 5).u16(*x).bool(*y),
            E::D => w.variant(3, 5),
            E::F(o) => w.variant(4, 5).option(o.as_ref(), |w, v| {
                w.u32(*v);
            }),
        };
    }

    #[test]
    fn every_shape_decodes_to_what_was_written() {
        let s = S {
            e: E::C { x: 0x1234, y: true },
            v: vec![1, 2, 255],
            n: u64::MAX - 5,
            rest: vec![E::A, E::B(9), E::D, E::F(Some(77)), E::F(None), E::C { x: 0, y: false }],
        };
        let mut w = Writer::new();
        write_e(&mut w, &s.e);
        w.vec(&s.v, |w, b| {
            w.u8(*b);
        });
        w.u64(s.n);
        w.rest_vec(&s.rest, write_e);
        let got = S::arbitrary_take_rest(Unstructured::new(&w.bytes)).unwrap();
        assert_eq!(got, s);
    }

    #[test]
    fn every_variant_of_odd_counts_and_every_small_range() {
        for count in 1..=40u32 {
            for index in 0..count {
                let mut w = Writer::new();
                w.variant(index, count);
                let x = u32::from_le_bytes(w.bytes[..4].try_into().unwrap());
                assert_eq!(((x as u64 * count as u64) >> 32) as u32, index, "{index} of {count}");
            }
        }
        for (lo, hi) in [(0u64, 0u64), (1, 3), (0, 19), (8, 159), (0, 255)] {
            for v in lo..=hi {
                let mut w = Writer::new();
                w.in_range(v, lo, hi);
                let got: u64 = Unstructured::new(&w.bytes).int_in_range(lo..=hi).unwrap();
                assert_eq!(got, v);
            }
        }
    }
}

//! The host disk every VM's virtual disk maps to, and its scheduler: one first-come-first-served queue
//! (`fifo`, the default), or a queue per container served in proportion to the containers' I/O weights
//! (`fair`, docs/scenario-format.md "disk").
//!
//! The emulator issues a request when the thread reaches it and reserves its service at once (see the
//! timing model in `sim/mod.rs`), so requests are never reordered after the fact. FIFO reserves the next
//! free slot of the one server. Fair approximates generalised processor sharing, which Linux's
//! per-process and per-cgroup schedulers of the papers' time (CFQ, then BFQ and `io.weight`) aim at:
//! each container has its own queue, and a request is served at the container's share of the disk,
//! `weight / (weight + the weights of the other containers with requests outstanding)`, from when its
//! own earlier requests are done. A container alone gets the whole disk (work-conserving, so every
//! request then costs what FIFO charges); a container streaming misses no longer pushes a light one's
//! requests behind its whole queue, it only takes its share. Each queue keeps its own sequential
//! positions (CFQ idles on a queue to keep a stream's locality), so a scanner stays sequential when
//! others are busy.
//!
//! Invariants: deterministic (no clock, no randomness); a request completes after it is issued and
//! after the same container's previous request; with one container, or with `fifo`, completion times
//! are exactly those of the one-queue model (FIFO's are the model's of before this module, so bundled
//! outputs are byte-identical).

/// Positions of the last page read and written: a request for the page after needs no positioning.
/// Reads and writes keep separate positions: write-back is done by flusher threads in large ordered
/// batches in Linux, so a page written right after the previously written one needs no positioning
/// even when reads came in between.
#[derive(Debug, Clone, Copy)]
struct Queue {
    busy: u64,
    last_read: u64,
    last_write: u64,
    weight: f64,
}

impl Queue {
    fn new(weight: f64) -> Queue {
        Queue { busy: 0, last_read: u64::MAX - 1, last_write: u64::MAX - 1, weight }
    }

    /// Service time of `pages` pages at `k` without a share, and the positions it leaves.
    fn service(&mut self, k: u64, pages: u64, write: bool, access: u64, xfer: u64) -> u64 {
        let last = if write { &mut self.last_write } else { &mut self.last_read };
        let seek = if k == last.wrapping_add(1) { 0 } else { access };
        *last = k + pages - 1;
        seek + pages * xfer
    }
}

/// The host disk (see the module doc).
#[derive(Debug, Clone)]
pub(super) struct Disk {
    /// Positioning time of a non-sequential request, ns.
    pub access: u64,
    /// Transfer time of one page, ns.
    pub xfer: u64,
    /// FIFO: the one queue.
    one: Queue,
    /// Fair: one queue per container (by container index), with its weight.
    fair: Option<Vec<Queue>>,
}

impl Disk {
    /// A FIFO disk, or (with `weights`, one per container) a fair one.
    pub fn new(access: u64, xfer: u64, weights: Option<Vec<u32>>) -> Disk {
        Disk {
            access,
            xfer,
            one: Queue::new(1.0),
            fair: weights.map(|w| w.into_iter().map(|w| Queue::new(w.max(1) as f64)).collect()),
        }
    }

    /// One request of `pages` pages at `k` by container `flow`, issued at `t`; returns its completion
    /// time.
    pub fn io(&mut self, flow: usize, t: u64, k: u64, pages: u64, write: bool) -> u64 {
        let (access, xfer) = (self.access, self.xfer);
        let Some(queues) = self.fair.as_mut() else {
            let start = t.max(self.one.busy);
            let done = start + self.one.service(k, pages, write, access, xfer);
            self.one.busy = done;
            return done;
        };
        let others: f64 =
            queues.iter().enumerate().filter(|&(j, q)| j != flow && q.busy > t).map(|(_, q)| q.weight).sum();
        let q = &mut queues[flow];
        let share = q.weight / (q.weight + others);
        let start = t.max(q.busy);
        let service = q.service(k, pages, write, access, xfer);
        let done = start + (service as f64 / share).round() as u64;
        q.busy = done;
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_queues_a_light_request_behind_a_heavy_backlog() {
        let mut d = Disk::new(100, 10, None);
        // Container 0 queues 100 random reads at t = 0; container 1's one read waits for all of them.
        for i in 0..100 {
            d.io(0, 0, i * 2, 1, false);
        }
        assert_eq!(d.io(1, 0, 10_000, 1, false), 101 * 110);
    }

    #[test]
    fn fair_serves_a_light_request_at_its_share() {
        let mut d = Disk::new(100, 10, Some(vec![100, 100]));
        for i in 0..100 {
            d.io(0, 0, i * 2, 1, false);
        }
        // Two queues active, equal weights: the light read takes twice its service time, not the
        // backlog's.
        assert_eq!(d.io(1, 0, 10_000, 1, false), 2 * 110);
    }

    #[test]
    fn fair_alone_is_fifo_and_weights_set_the_share() {
        let (mut f, mut q) = (Disk::new(100, 10, None), Disk::new(100, 10, Some(vec![100, 300])));
        for i in 0..10 {
            assert_eq!(f.io(0, i * 50, i * 3, 2, i % 2 == 0), q.io(0, i * 50, i * 3, 2, i % 2 == 0));
        }
        let busy_until = q.io(0, 0, 1_000, 1, false);
        // Container 1 (weight 300) gets three quarters of the disk while 0 is busy.
        assert_eq!(q.io(1, 0, 5_000, 1, false), (110.0_f64 / 0.75).round() as u64);
        assert!(busy_until > 110);
    }

    #[test]
    fn fair_keeps_each_queues_sequential_position() {
        let mut d = Disk::new(100, 10, Some(vec![100, 100]));
        let a = d.io(0, 0, 0, 1, false);
        d.io(1, 0, 500, 1, false);
        // The next page of container 0's stream needs no positioning although 1 read elsewhere.
        let b = d.io(0, a, 1, 1, false);
        assert!(b - a <= 2 * 10, "{a} {b}");
    }
}

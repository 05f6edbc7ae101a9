//! Engine configuration: plain data with documented defaults and one `validate()` that names the bad
//! field. Units are in the field names (`_bytes`, `_ms`, `_ppm`).

use crate::error::CacheError;
use crate::types::Mode;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub const MIB: u64 = 1024 * 1024;
pub const GIB: u64 = 1024 * MIB;

/// The most pages the memory store's arena may hold (`mem.max_capacity_bytes / page_size_bytes`): a
/// compressed page's frame id is `1 << 31 | frame << 1 | half` (`store::mem`), so frame numbers must fit
/// in 30 bits.
pub const MAX_MEM_FRAMES: u32 = 1 << 30;

/// Whether to open the SSD file with `O_DIRECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectIo {
    /// Use direct I/O when the file system accepts it, buffered I/O otherwise.
    #[default]
    Auto,
    On,
    Off,
}

/// Which system calls the SSD store issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoBackend {
    /// io_uring when the kernel allows it, pread/pwrite otherwise.
    #[default]
    Auto,
    Uring,
    Sync,
}

/// How hybrid demotion/promotion and capacity convergence run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Maintenance {
    /// Background worker threads move pages (the daemon).
    #[default]
    Background,
    /// The operation that crosses a watermark does the move before returning (deterministic: the lab
    /// and tests).
    Inline,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemStoreConfig {
    /// Capacity of the memory store. Default 256 MiB.
    pub capacity_bytes: u64,
    /// Address space reserved for the arena, so the capacity can grow at run time up to this without
    /// moving frames. Pages are committed lazily. Default: the larger of `capacity_bytes` and 1 GiB.
    pub max_capacity_bytes: Option<u64>,
    /// Equal pages share one frame (content de-duplication, `store::dedup`). Default off.
    pub dedup: bool,
    /// Compress pages; one that compresses to half a page or less takes half a frame. Default none.
    pub compression: Compression,
    /// Ask the kernel to back the arena with transparent huge pages (`madvise(MADV_HUGEPAGE)`; a no-op
    /// where THP is disabled). Frames are read and written at random places of the arena, and with
    /// 4 KiB pages nearly every get and put misses the TLB and walks the page tables (twice over in a
    /// VM); 2 MiB pages keep the walk out of the data path (docs/decisions.md D26). Memory is still
    /// committed on first touch, 2 MiB at a time. Default true.
    pub huge_pages: bool,
}

/// Page compression of the memory store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    /// LZ4 (`lz4_flex`): fast enough for the put path; incompressible pages are stored raw.
    Lz4,
}

impl Default for MemStoreConfig {
    fn default() -> Self {
        MemStoreConfig {
            capacity_bytes: 256 * MIB,
            max_capacity_bytes: None,
            dedup: false,
            compression: Compression::None,
            huge_pages: true,
        }
    }
}

impl MemStoreConfig {
    pub fn max_bytes(&self) -> u64 {
        self.max_capacity_bytes.unwrap_or_else(|| self.capacity_bytes.max(GIB))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SsdStoreConfig {
    /// The backing file (created if missing; its old contents are never served). Default
    /// `./dd-data/ssd-store.bin`. With `scratch`, the directory the unnamed file is created in.
    pub path: PathBuf,
    /// The file has no name (`O_TMPFILE`, or unlinked as soon as it is open): no exit, a crash or SIGKILL
    /// included, leaves it behind. Default false (a named file the operator can see).
    pub scratch: bool,
    /// Capacity of the SSD store. Default 1 GiB.
    pub capacity_bytes: u64,
    pub direct_io: DirectIo,
    pub io_backend: IoBackend,
    /// Pages that may wait in the write-behind queue before puts block. Default 1024 (4 MiB).
    pub write_queue_pages: usize,
}

impl Default for SsdStoreConfig {
    fn default() -> Self {
        SsdStoreConfig {
            path: PathBuf::from("dd-data/ssd-store.bin"),
            scratch: false,
            capacity_bytes: GIB,
            direct_io: DirectIo::Auto,
            io_backend: IoBackend::Auto,
            write_queue_pages: 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HybridConfig {
    /// The memory tier of a hybrid pool demotes once its use exceeds `limit - limit * margin / 1e6`.
    /// Default 15 625 ppm (1/64), which gives the 504 MiB of 512 MiB of thesis 000, Table 5.1. The
    /// same margin is the SSD tier's eviction watermark.
    pub high_watermark_margin_ppm: u32,
    /// Pages are promoted from SSD while memory use is below `limit - low_watermark_margin_bytes`
    /// (thesis 000, eq. 5.2), and never past the high watermark: where `limit * margin_ppm / 1e6` is the
    /// wider margin (limits above 4 GiB with the defaults) promotion stops there, or the next step would
    /// demote what it promoted. Default 64 MiB.
    pub low_watermark_margin_bytes: u64,
    /// Pages moved per demotion or promotion step. Default 2 MiB.
    pub move_batch_bytes: u64,
}

impl Default for HybridConfig {
    fn default() -> Self {
        HybridConfig {
            high_watermark_margin_ppm: 15_625,
            low_watermark_margin_bytes: 64 * MIB,
            move_batch_bytes: 2 * MIB,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Bytes per page. Default 4096. A power of two from 512 to 65536.
    pub page_size_bytes: usize,
    pub mem: MemStoreConfig,
    /// The SSD store; `None` runs memory-only.
    pub ssd: Option<SsdStoreConfig>,
    pub mode: Mode,
    /// Pages evicted at once from the victim when a store is full. Default 2 MiB.
    pub eviction_batch_bytes: u64,
    pub hybrid: HybridConfig,
    pub maintenance: Maintenance,
    /// Period of the background worker's sweep (watermarks, capacity convergence). Default 10 ms.
    pub maintenance_interval_ms: u64,
    /// Largest batch a single batched call may carry. Default 256 pages.
    pub max_batch_pages: usize,
    /// Most pools the cache will hold, all VMs together. Default 65 536.
    pub max_pools: usize,
    /// Most pools one VM may hold (its quota; the host administrator can set another per VM, see
    /// [`crate::Cache::set_vm_pool_quota`]). Default 1024.
    #[serde(default = "default_max_pools_per_vm")]
    pub max_pools_per_vm: usize,
    /// Shards of a new pool whose options do not name a count (`PoolOptions::shards` 0): a power of two
    /// up to 256, or 0 (the default) for twice the host's cores rounded up to a power of two, at most 64
    /// (`pool.rs`: each shard is an independent index, queue and lock). One shard is a single queue
    /// (what the lab runs with).
    #[serde(default)]
    pub pool_shards: u32,
}

/// The shard count `pool_shards = 0` stands for: twice the host's cores, rounded up to a power of two, at
/// most 64.
pub fn default_pool_shards() -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    (2 * cores).next_power_of_two().min(64)
}

/// The largest shard count a pool may have.
pub const MAX_POOL_SHARDS: u32 = 256;

/// Checks a shard count (0 or a power of two up to [`MAX_POOL_SHARDS`]); the error names `field`.
pub(crate) fn check_shards(field: &str, shards: u32) -> Result<(), CacheError> {
    if shards != 0 && (!shards.is_power_of_two() || shards > MAX_POOL_SHARDS) {
        return Err(CacheError::invalid(field, format!("{shards} is not 0 or a power of two up to 256")));
    }
    Ok(())
}

fn default_max_pools_per_vm() -> usize {
    1024
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            page_size_bytes: 4096,
            mem: MemStoreConfig::default(),
            ssd: None,
            mode: Mode::Partitioned,
            eviction_batch_bytes: 2 * MIB,
            hybrid: HybridConfig::default(),
            maintenance: Maintenance::Background,
            maintenance_interval_ms: 10,
            max_batch_pages: 256,
            max_pools: 65_536,
            max_pools_per_vm: default_max_pools_per_vm(),
            pool_shards: 0,
        }
    }
}

impl EngineConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), CacheError> {
        let ps = self.page_size_bytes;
        if !(512..=65536).contains(&ps) || !ps.is_power_of_two() {
            return Err(CacheError::invalid(
                "page_size_bytes",
                format!("{ps} is not a power of two in 512..=65536"),
            ));
        }
        let ps = ps as u64;
        if self.mem.max_bytes() < self.mem.capacity_bytes {
            return Err(CacheError::invalid("mem.max_capacity_bytes", "smaller than mem.capacity_bytes"));
        }
        if self.mem.max_bytes() / ps > MAX_MEM_FRAMES as u64 {
            return Err(CacheError::invalid(
                "mem.max_capacity_bytes",
                "more than 2^30 pages (a compressed page's frame id keeps the top bit and one half bit)",
            ));
        }
        if let Some(ssd) = &self.ssd {
            if ssd.capacity_bytes / ps > u32::MAX as u64 {
                return Err(CacheError::invalid("ssd.capacity_bytes", "more than 2^32 pages"));
            }
            if ssd.write_queue_pages == 0 {
                return Err(CacheError::invalid("ssd.write_queue_pages", "must be at least 1"));
            }
            if ssd.path.as_os_str().is_empty() {
                return Err(CacheError::invalid("ssd.path", "must not be empty"));
            }
        }
        if self.eviction_batch_bytes < ps {
            return Err(CacheError::invalid("eviction_batch_bytes", "smaller than one page"));
        }
        if self.hybrid.move_batch_bytes < ps {
            return Err(CacheError::invalid("hybrid.move_batch_bytes", "smaller than one page"));
        }
        if self.hybrid.high_watermark_margin_ppm >= 1_000_000 {
            return Err(CacheError::invalid("hybrid.high_watermark_margin_ppm", "must be below 1 000 000"));
        }
        if self.maintenance_interval_ms == 0 {
            return Err(CacheError::invalid("maintenance_interval_ms", "must be at least 1"));
        }
        if self.max_batch_pages == 0 {
            return Err(CacheError::invalid("max_batch_pages", "must be at least 1"));
        }
        if self.max_pools == 0 {
            return Err(CacheError::invalid("max_pools", "must be at least 1"));
        }
        if self.max_pools_per_vm == 0 || self.max_pools_per_vm > u32::MAX as usize {
            return Err(CacheError::invalid("max_pools_per_vm", "must be 1 to 2^32 - 1"));
        }
        check_shards("pool_shards", self.pool_shards)?;
        Ok(())
    }

    pub(crate) fn pages(&self, bytes: u64) -> u64 {
        bytes / self.page_size_bytes as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 15, item 4: the configuration accepted up to 2^32 frames while a compressed page's
    /// `FrameId` is `1 << 31 | frame << 1 | half`, so frame numbers from 2^30 up aliased other ids.
    #[test]
    fn regression_config_accepts_2_32_frames_while_frame_id_marks_halves_with_bit_31() {
        let mut cfg = EngineConfig::default();
        let ps = cfg.page_size_bytes as u64;
        cfg.mem.max_capacity_bytes = Some((1u64 << 30) * ps);
        cfg.validate().expect("2^30 frames fit a frame id");
        cfg.mem.max_capacity_bytes = Some(((1u64 << 30) + 1) * ps);
        let err = cfg.validate().expect_err("2^30 + 1 frames would alias half ids");
        assert!(err.to_string().contains("mem.max_capacity_bytes"), "{err}");
        cfg.mem.max_capacity_bytes = Some((u32::MAX as u64) * ps);
        assert!(cfg.validate().is_err(), "2^32 - 1 frames accepted");
    }

    /// A shard count is 0 (from the cores) or a power of two up to 256; a bad one names its field.
    #[test]
    fn pool_shards_must_be_zero_or_a_power_of_two() {
        for ok in [0, 1, 2, 64, 256] {
            EngineConfig { pool_shards: ok, ..Default::default() }.validate().unwrap();
        }
        for bad in [3, 6, 512] {
            let err = EngineConfig { pool_shards: bad, ..Default::default() }.validate().unwrap_err();
            assert!(err.to_string().contains("pool_shards"), "{err}");
        }
        assert!(default_pool_shards().is_power_of_two() && default_pool_shards() <= 64);
    }
}

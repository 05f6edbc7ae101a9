//! Issue 35: what the engine keeps per VM and per pool goes when they go. `Cache::table_sizes` is back
//! to its first value after pools and VMs come and go, the pool table's capacity shrinks after a burst,
//! and a destroyed pool that a handle still holds is counted until the handle goes.

mod common;

use common::*;
use dd_engine::{Key, PoolOptions, Spec, TableSizes, VmId, VmWeights};

#[test]
fn regression_tables_come_back_to_their_size_after_pools_and_vms_go() {
    let dir = tempfile::tempdir().unwrap();
    let c = small_cache(dir.path(), 4096, 0, 16);
    c.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
    let start = c.table_sizes();
    assert_eq!((start.vms, start.pools, start.pool_table_entries, start.pool_objects_alive), (1, 0, 0, 0));
    // A burst of 1,000 pools with pages, then all destroyed: the table shrinks back.
    let pools: Vec<_> = (0..1000)
        .map(|_| c.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap())
        .collect();
    for &p in &pools {
        for i in 0..3 {
            c.put(VmId(1), p, Key::new(1, i), &page(p, Key::new(1, i), 1)).unwrap();
        }
    }
    let burst = c.table_sizes();
    assert_eq!((burst.pools, burst.pool_table_entries, burst.pool_objects_alive), (1000, 1000, 1000));
    for &p in &pools {
        c.destroy_pool(VmId(1), p).unwrap();
    }
    // This thread's last-pool slot may still hold the pool it put to last (one thread: one pool).
    let after = c.table_sizes();
    assert_eq!((after.vms, after.pools, after.pool_table_entries), (1, 0, 0));
    assert!(after.pool_objects_alive <= 1, "{after:?}");
    assert!(after.pool_table_capacity <= 16 * 16, "the pool table kept {after:?} after the burst {burst:?}");
    // VMs with pools, removed with them.
    for v in 2..50 {
        c.add_vm(VmId(v), VmWeights::equal(1)).unwrap();
        let p = c.new_pool(VmId(v), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
        c.put(VmId(v), p, Key::new(0, 0), &page(p, Key::new(0, 0), 1)).unwrap();
        c.remove_vm(VmId(v)).unwrap();
    }
    let mut after: TableSizes = c.table_sizes();
    assert!(after.pool_table_capacity <= 16 * 16 && after.pool_objects_alive <= 1, "{after:?}");
    after.pool_table_capacity = start.pool_table_capacity;
    after.pool_objects_alive = start.pool_objects_alive;
    assert_eq!(after, start, "tables after the VMs, less the pool table's capacity");
    assert_identity(&c);
}

#[test]
fn a_destroyed_pool_held_by_a_handle_is_counted_until_the_handle_goes() {
    let dir = tempfile::tempdir().unwrap();
    let c = small_cache(dir.path(), 1024, 0, 16);
    c.add_vm(VmId(1), VmWeights::equal(1)).unwrap();
    let p = c.new_pool(VmId(1), PoolOptions::ephemeral(Spec::Mem { weight: 1 })).unwrap();
    let h = c.pool_handle(VmId(1), p).unwrap();
    for i in 0..100 {
        h.put(Key::new(i % 7, i), &page(p, Key::new(i % 7, i), 1)).unwrap();
    }
    c.destroy_pool(VmId(1), p).unwrap();
    let t = c.table_sizes();
    assert_eq!((t.pools, t.pool_table_entries, t.pool_objects_alive), (0, 0, 1));
    // The handle sees a destroyed pool, and putting through it stores nothing.
    assert!(h.put(Key::new(0, 0), &page(p, Key::new(0, 0), 2)).is_err());
    drop(h);
    assert_eq!(c.table_sizes().pool_objects_alive, 0);
    assert_identity(&c);
}

//! The decision function: snapshot in, one reclaim action out. Pure, integer arithmetic, deterministic.
//!
//! Equations of thesis 000, section 4.3.1, over the containers in play:
//!
//! ```text
//! TU = Σ U_i      TW = Σ W_i      PA_i = TU × W_i / TW      EX_i = U_i − PA_i
//! ```
//!
//! To keep "the exceeds sum to zero" exact in integers, exceeds are computed scaled by TW:
//! `EX_i × TW = U_i × TW − TU × W_i` (an `i128`, so no `u64` input can overflow it); the victim is the
//! container with the largest scaled exceed, ties to the lowest index. The byte value reported is the
//! scaled exceed divided by TW, rounded down.
//!
//! Policies:
//! * [`Policy::LinuxDefault`] — the baseline the thesis compares against (its section 2.1.3 / 4.1):
//!   soft-limit reclaim from the container with the largest `usage − soft_limit` (no chunk cap: Linux
//!   reclaims as much as the request needs from it), then, once everyone is at or below the soft limit,
//!   the global LRU.
//! * [`Policy::Proportional`] — the thesis's policy 1: one chunk of at most `chunk_cap_bytes` from the
//!   container with the largest proportional exceed, bounded by that exceed and by what it can give.
//!   If every exceed is zero (usage already exactly in ratio) there is no proportional victim and the
//!   request falls back to the LRU of all containers together, as the thesis's controller falls back to
//!   the global LRU once proportional reclaim cannot help.
//! * [`Policy::ProportionalClasses`] — policy 2: the same, among the containers of the lowest class that
//!   can still give (bronze, then silver, then gold); exceeds are computed within that class, and the
//!   fallback LRU is that class's, never the gold containers' while others can give.
//!
//! A container "can give" when its `reclaimable_bytes` is non-zero; the backend decides what is
//! reclaimable (usage above a floor, file pages, ...).

use serde::{Deserialize, Serialize};

pub const MIB: u64 = 1024 * 1024;

/// Quality-of-service class: reclaim goes bronze first, gold last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Bronze,
    #[default]
    Silver,
    Gold,
}

/// One container as the controller sees it. Sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSnapshot {
    pub name: String,
    pub usage_bytes: u64,
    pub weight: u32,
    #[serde(default)]
    pub class: Class,
    /// Linux soft limit (`memory.soft_limit_in_bytes` / `memory.low`-like floor); `u64::MAX` when unset.
    pub soft_limit_bytes: u64,
    /// What the backend can take from this container now.
    pub reclaimable_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Soft-limit exceed first, then global LRU (Linux's own behaviour; the baseline).
    LinuxDefault,
    /// Largest weight-proportional exceed first, in capped chunks.
    #[default]
    Proportional,
    /// Proportional, within the lowest class that can give.
    ProportionalClasses,
}

/// Settings of the decision. Plain data; `validate` names a bad field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DecisionConfig {
    pub policy: Policy,
    /// Most bytes one request takes from one container. Default 50 MiB (thesis 000, section 4.4.2).
    pub chunk_cap_bytes: u64,
}

impl Default for DecisionConfig {
    fn default() -> Self {
        DecisionConfig { policy: Policy::Proportional, chunk_cap_bytes: 50 * MIB }
    }
}

/// A configuration value the controller cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("invalid memory-controller setting {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

impl DecisionConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.chunk_cap_bytes == 0 {
            return Err(ConfigError::Invalid {
                field: "chunk_cap_bytes",
                reason: "must be at least 1".into(),
            });
        }
        Ok(())
    }
}

/// Why a container was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// Largest usage over soft limit (Linux's soft reclaim).
    SoftLimitExceed,
    /// Largest weight-proportional exceed.
    ProportionalExceed,
}

/// What one reclaim request does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    /// Reclaim `bytes` from container `index` of the snapshot.
    Reclaim { index: usize, bytes: u64, reason: Reason },
    /// No single container is over its share: reclaim `bytes` from the LRU of these containers taken
    /// together (the global LRU when `members` is everyone; one class's containers under
    /// [`Policy::ProportionalClasses`], so gold stays protected).
    Lru { members: Vec<usize>, bytes: u64 },
    /// Nothing to do (nothing needed, or nobody can give).
    None,
}

/// Proportional exceeds of `members` (indices into `snap`), scaled by the members' total weight.
/// Returns `(scaled exceeds aligned with members, total weight)`.
fn scaled_exceeds(snap: &[ContainerSnapshot], members: &[usize]) -> (Vec<i128>, i128) {
    let tu: i128 = members.iter().map(|&i| snap[i].usage_bytes as i128).sum();
    let tw: i128 = members.iter().map(|&i| snap[i].weight as i128).sum();
    let ex =
        members.iter().map(|&i| snap[i].usage_bytes as i128 * tw - tu * snap[i].weight as i128).collect();
    (ex, tw)
}

/// Eq. 4.4 for every container, in bytes (rounded toward negative infinity). With all weights zero,
/// every exceed is zero.
pub fn exceeds(snap: &[ContainerSnapshot]) -> Vec<i128> {
    let all: Vec<usize> = (0..snap.len()).collect();
    let (ex, tw) = scaled_exceeds(snap, &all);
    ex.into_iter().map(|x| if tw == 0 { 0 } else { x.div_euclid(tw) }).collect()
}

/// Decides one reclaim request of `need_bytes`.
pub fn decide(snap: &[ContainerSnapshot], need_bytes: u64, cfg: &DecisionConfig) -> Action {
    if need_bytes == 0 {
        return Action::None;
    }
    match cfg.policy {
        Policy::LinuxDefault => linux_default(snap, need_bytes),
        Policy::Proportional => {
            let members: Vec<usize> = (0..snap.len()).collect();
            proportional(snap, &members, need_bytes, cfg.chunk_cap_bytes)
        }
        Policy::ProportionalClasses => {
            for class in [Class::Bronze, Class::Silver, Class::Gold] {
                let members: Vec<usize> = (0..snap.len()).filter(|&i| snap[i].class == class).collect();
                if members.iter().any(|&i| snap[i].reclaimable_bytes > 0) {
                    return proportional(snap, &members, need_bytes, cfg.chunk_cap_bytes);
                }
            }
            Action::None
        }
    }
}

/// The LRU fallback over `members` that can give, or nothing when none can.
fn lru_of(snap: &[ContainerSnapshot], members: &[usize], need: u64) -> Action {
    let givers: Vec<usize> = members.iter().copied().filter(|&i| snap[i].reclaimable_bytes > 0).collect();
    if givers.is_empty() {
        Action::None
    } else {
        Action::Lru { members: givers, bytes: need }
    }
}

fn linux_default(snap: &[ContainerSnapshot], need: u64) -> Action {
    let mut best: Option<(u64, usize)> = None;
    for (i, c) in snap.iter().enumerate() {
        let over = c.usage_bytes.saturating_sub(c.soft_limit_bytes);
        if over == 0 || c.reclaimable_bytes == 0 {
            continue;
        }
        if best.is_none_or(|(b, _)| over > b) {
            best = Some((over, i));
        }
    }
    match best {
        Some((over, i)) => Action::Reclaim {
            index: i,
            bytes: need.min(over).min(snap[i].reclaimable_bytes),
            reason: Reason::SoftLimitExceed,
        },
        None => lru_of(snap, &(0..snap.len()).collect::<Vec<_>>(), need),
    }
}

fn proportional(snap: &[ContainerSnapshot], members: &[usize], need: u64, cap: u64) -> Action {
    let (ex, tw) = scaled_exceeds(snap, members);
    if tw == 0 {
        return lru_of(snap, members, need);
    }
    let mut best: Option<(i128, usize)> = None;
    for (k, &i) in members.iter().enumerate() {
        if snap[i].reclaimable_bytes == 0 {
            continue;
        }
        if best.is_none_or(|(b, _)| ex[k] > b) {
            best = Some((ex[k], i));
        }
    }
    let Some((scaled, i)) = best else { return lru_of(snap, members, need) };
    let exceed = scaled.div_euclid(tw);
    if exceed <= 0 {
        return lru_of(snap, members, need);
    }
    let bytes = (exceed as u64).min(cap).min(snap[i].reclaimable_bytes).min(need);
    Action::Reclaim { index: i, bytes, reason: Reason::ProportionalExceed }
}

/// Applies [`decide`] repeatedly to a copy of the snapshot until `need_bytes` are reclaimed or nothing
/// more can be, assuming each action frees exactly what it asks (an LRU action is assumed to take from
/// its members in proportion to their reclaimable memory). Returns the actions in order.
pub fn plan(snap: &[ContainerSnapshot], need_bytes: u64, cfg: &DecisionConfig) -> Vec<Action> {
    let mut s = snap.to_vec();
    let mut left = need_bytes;
    let mut out = Vec::new();
    while left > 0 {
        let a = decide(&s, left, cfg);
        match &a {
            Action::Reclaim { index, bytes, .. } => {
                let c = &mut s[*index];
                c.usage_bytes -= (*bytes).min(c.usage_bytes);
                c.reclaimable_bytes -= *bytes;
                left -= *bytes;
            }
            Action::Lru { members, bytes } => {
                let total: u128 = members.iter().map(|&i| s[i].reclaimable_bytes as u128).sum();
                let mut taken = 0u64;
                for &i in members {
                    let c = &mut s[i];
                    let share = ((*bytes as u128 * c.reclaimable_bytes as u128) / total.max(1)) as u64;
                    let share = share.min(c.reclaimable_bytes).min(c.usage_bytes);
                    c.usage_bytes -= share;
                    c.reclaimable_bytes -= share;
                    taken += share;
                }
                if taken == 0 {
                    out.push(a);
                    break;
                }
                left = left.saturating_sub(taken);
            }
            Action::None => break,
        }
        out.push(a);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(name: &str, usage_mib: u64, weight: u32, class: Class) -> ContainerSnapshot {
        ContainerSnapshot {
            name: name.into(),
            usage_bytes: usage_mib * MIB,
            weight,
            class,
            soft_limit_bytes: u64::MAX,
            reclaimable_bytes: usage_mib * MIB,
        }
    }

    #[test]
    fn thesis_example_policy_1() {
        // Section 4.3.2: intended 1:2, usage 2 GiB and 4 GiB with soft limits 1 GiB and 2 GiB. Linux's
        // soft-limit reclaim takes from the 4 GiB container (exceed 2 GiB vs 1 GiB) and breaks 1:2;
        // the proportional policy sees both exactly in ratio (exceeds 0) and ...
        let mut a = c("low", 2048, 1, Class::Silver);
        let mut b = c("high", 4096, 2, Class::Silver);
        a.soft_limit_bytes = 1024 * MIB;
        b.soft_limit_bytes = 2048 * MIB;
        let snap = vec![a, b];
        let linux = DecisionConfig { policy: Policy::LinuxDefault, ..Default::default() };
        assert_eq!(
            decide(&snap, 1024 * MIB, &linux),
            Action::Reclaim { index: 1, bytes: 1024 * MIB, reason: Reason::SoftLimitExceed }
        );
        assert_eq!(exceeds(&snap), vec![0, 0]);
        // ... falls back to the LRU of both, which takes from each by its reclaimable share.
        let prop = DecisionConfig::default();
        assert_eq!(decide(&snap, 1024 * MIB, &prop), Action::Lru { members: vec![0, 1], bytes: 1024 * MIB });
    }

    #[test]
    fn proportional_takes_capped_chunks_from_the_largest_exceed() {
        // 1:2 intended, 3000 and 3000 MiB used: PA = 2000 / 4000, EX = +1000 / -1000.
        let snap = vec![c("a", 3000, 1, Class::Silver), c("b", 3000, 2, Class::Silver)];
        assert_eq!(exceeds(&snap), vec![1000 * MIB as i128, -1000 * MIB as i128]);
        let a = decide(&snap, 500 * MIB, &DecisionConfig::default());
        assert_eq!(a, Action::Reclaim { index: 0, bytes: 50 * MIB, reason: Reason::ProportionalExceed });
        // A plan converges towards 1:2.
        let steps = plan(&snap, 1500 * MIB, &DecisionConfig::default());
        let from_a: u64 = steps
            .iter()
            .map(|s| match s {
                Action::Reclaim { index: 0, bytes, .. } => *bytes,
                _ => 0,
            })
            .sum();
        assert!(from_a >= 1000 * MIB, "a must give at least its 1000 MiB exceed, gave {}", from_a / MIB);
    }

    #[test]
    fn classes_protect_gold_until_others_cannot_give() {
        let mut snap = vec![c("gold", 4000, 1000, Class::Gold), c("silver", 100, 1, Class::Silver)];
        let cfg = DecisionConfig { policy: Policy::ProportionalClasses, ..Default::default() };
        // Silver is alone in its class (exceed 0): the request goes to silver's own LRU, not to gold.
        assert_eq!(decide(&snap, 10 * MIB, &cfg), Action::Lru { members: vec![1], bytes: 10 * MIB });
        // Once silver is at its floor, gold gives.
        snap[1].reclaimable_bytes = 0;
        assert_eq!(decide(&snap, 10 * MIB, &cfg), Action::Lru { members: vec![0], bytes: 10 * MIB });
        // Among two gold containers out of ratio, the proportional rule applies.
        snap.push(c("gold-2", 1000, 1000, Class::Gold));
        assert_eq!(
            decide(&snap, 10 * MIB, &cfg),
            Action::Reclaim { index: 0, bytes: 10 * MIB, reason: Reason::ProportionalExceed }
        );
    }

    fn snapshot_strategy() -> impl Strategy<Value = Vec<ContainerSnapshot>> {
        prop::collection::vec((0u64..(64 << 30), 0u32..1000, 0u8..3, 0u64..(64 << 30), any::<bool>()), 1..8)
            .prop_map(|v| {
                v.into_iter()
                    .enumerate()
                    .map(|(i, (usage, weight, class, soft, all))| ContainerSnapshot {
                        name: format!("c{i}"),
                        usage_bytes: usage,
                        weight,
                        class: [Class::Bronze, Class::Silver, Class::Gold][class as usize],
                        soft_limit_bytes: soft,
                        reclaimable_bytes: if all { usage } else { usage / 3 },
                    })
                    .collect()
            })
    }

    fn any_policy() -> impl Strategy<Value = DecisionConfig> {
        (0u8..3, 1u64..(256 << 20)).prop_map(|(p, cap)| DecisionConfig {
            policy: [Policy::LinuxDefault, Policy::Proportional, Policy::ProportionalClasses][p as usize],
            chunk_cap_bytes: cap,
        })
    }

    proptest! {
        #[test]
        fn scaled_exceeds_sum_to_zero(snap in snapshot_strategy()) {
            let all: Vec<usize> = (0..snap.len()).collect();
            let (ex, _) = scaled_exceeds(&snap, &all);
            prop_assert_eq!(ex.iter().sum::<i128>(), 0);
        }

        #[test]
        fn victim_has_the_largest_exceed_and_the_chunk_is_bounded(
            snap in snapshot_strategy(), need in 1u64..(8 << 30), cap in 1u64..(256 << 20)
        ) {
            let cfg = DecisionConfig { policy: Policy::Proportional, chunk_cap_bytes: cap };
            if let Action::Reclaim { index, bytes, .. } = decide(&snap, need, &cfg) {
                let ex = exceeds(&snap);
                for (j, c) in snap.iter().enumerate() {
                    if c.reclaimable_bytes > 0 {
                        prop_assert!(ex[index] >= ex[j]);
                        // Deterministic ties: the lowest index wins.
                        if ex[index] == ex[j] { prop_assert!(index <= j); }
                    }
                }
                prop_assert!(bytes > 0);
                prop_assert!(bytes <= cap);
                prop_assert!(bytes as i128 <= ex[index]);
                prop_assert!(bytes <= snap[index].reclaimable_bytes);
                prop_assert!(bytes <= need);
            }
        }

        #[test]
        fn gold_is_chosen_only_when_no_other_class_can_give(snap in snapshot_strategy(), need in 1u64..(8 << 30)) {
            let cfg = DecisionConfig { policy: Policy::ProportionalClasses, ..Default::default() };
            let chosen: Vec<usize> = match decide(&snap, need, &cfg) {
                Action::Reclaim { index, .. } => vec![index],
                Action::Lru { members, .. } => members,
                Action::None => vec![],
            };
            for index in chosen {
                if snap[index].class == Class::Gold {
                    prop_assert!(snap.iter().all(|c| c.class == Class::Gold || c.reclaimable_bytes == 0));
                }
                if snap[index].class == Class::Silver {
                    prop_assert!(snap.iter().all(|c| c.class != Class::Bronze || c.reclaimable_bytes == 0));
                }
            }
        }

        #[test]
        fn equal_snapshots_give_equal_actions(snap in snapshot_strategy(), need in 0u64..(8 << 30), cfg in any_policy()) {
            let copy = snap.clone();
            prop_assert_eq!(decide(&snap, need, &cfg), decide(&copy, need, &cfg));
            prop_assert_eq!(plan(&snap, need, &cfg), plan(&copy, need, &cfg));
        }

        #[test]
        fn linux_default_prefers_the_largest_soft_limit_exceed(snap in snapshot_strategy(), need in 1u64..(8 << 30)) {
            let cfg = DecisionConfig { policy: Policy::LinuxDefault, ..Default::default() };
            match decide(&snap, need, &cfg) {
                Action::Reclaim { index, bytes, reason } => {
                    prop_assert_eq!(reason, Reason::SoftLimitExceed);
                    let over = |c: &ContainerSnapshot| c.usage_bytes.saturating_sub(c.soft_limit_bytes);
                    for c in snap.iter().filter(|c| c.reclaimable_bytes > 0) {
                        prop_assert!(over(&snap[index]) >= over(c));
                    }
                    prop_assert!(bytes <= over(&snap[index]).min(snap[index].reclaimable_bytes).min(need));
                }
                Action::Lru { .. } => {
                    prop_assert!(snap.iter().all(|c| c.reclaimable_bytes == 0 || c.usage_bytes <= c.soft_limit_bytes));
                }
                Action::None => prop_assert!(snap.iter().all(|c| c.reclaimable_bytes == 0)),
            }
        }

        #[test]
        fn plans_terminate_and_never_overdraw(snap in snapshot_strategy(), need in 0u64..(8 << 30), cfg in any_policy()) {
            let steps = plan(&snap, need, &cfg);
            let directed: u64 = steps.iter().map(|s| match s { Action::Reclaim { bytes, .. } => *bytes, _ => 0 }).sum();
            prop_assert!(directed <= need);
        }
    }
}

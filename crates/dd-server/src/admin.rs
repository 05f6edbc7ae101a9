//! The admin API: HTTP/JSON over axum, described by `docs/admin-api.yaml` (OpenAPI 3.1; the
//! conformance test in `crates/doubledecker/tests/` checks real responses against it).
//!
//! Two scopes with separate credentials, both `Authorization: Bearer <token>`:
//! * host scope (`/v1/host`, `/v1/vms...`, `/v1/stats`, `/v1/history`, `/metrics`): the host
//!   administrator's token;
//! * VM scope (`/v1/vm/...`): one VM's admin token, which selects the VM. There is no VM id in these
//!   paths, so a VM administrator cannot even name another VM; pools of other VMs are reported as
//!   `unknown_pool`, like pools that do not exist.
//!
//! Every error is JSON `{"code": "<stable name>", "message": "..."}`; codes are the engine's
//! `CacheError::code_name()` plus `unauthorized`, `not_found`, `method_not_allowed`, `malformed_json`,
//! `payload_too_large`, `bad_request`, `internal`, and the provisioner reports' `invalid_report` and
//! `no_report` (the reports are kept in `crate::provisioner`). Engine calls that may evict or free many pages run
//! on the blocking pool.
//!
//! A VM-scope request runs inside the registration its token belongs to (`auth::Registration::enter`):
//! once the VM is removed or its tokens replaced, the old admin token acts on nothing, not even on a VM
//! registered again under the same id.

use crate::auth::{token_problem, Registration, TokenKind};
use crate::config::VmConfig;
use crate::provisioner::StoredReport;
use crate::state::{PersistError, ServerState};
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use dd_engine::{
    CacheError, EvictionOrder, Mode, PoolId, PoolKind, PoolOptions, Spec, StoreKind, VmId, VmWeights,
};
use dd_provision::report::RoundReport;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

type St = State<Arc<ServerState>>;

/// Largest JSON body accepted.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// An API error: HTTP status plus the JSON body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(ErrorBody { code: self.code, message: &self.message })).into_response()
    }
}

fn err(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError { status, code, message: message.into() }
}

impl From<CacheError> for ApiError {
    fn from(e: CacheError) -> Self {
        let status = match &e {
            CacheError::UnknownVm(_) | CacheError::UnknownPool(_) => StatusCode::NOT_FOUND,
            CacheError::VmExists(_) | CacheError::TooManyPools(_) | CacheError::HostPoolLimit => {
                StatusCode::CONFLICT
            }
            CacheError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        };
        err(status, e.code_name(), e.to_string())
    }
}

impl From<PersistError> for ApiError {
    fn from(e: PersistError) -> Self {
        match e {
            PersistError::Engine(e) => e.into(),
            // The change is not in force (see `state`): a server-side failure, named like the engine's.
            PersistError::File(e) => err(StatusCode::INTERNAL_SERVER_ERROR, "io_error", e.to_string()),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            let msg = format!("the body exceeds the limit of {MAX_BODY_BYTES} bytes");
            return err(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", msg);
        }
        err(StatusCode::BAD_REQUEST, "malformed_json", r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        err(StatusCode::BAD_REQUEST, "bad_request", r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        err(StatusCode::BAD_REQUEST, "bad_request", r.body_text())
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The token of `Authorization: Bearer <token>`: the scheme (any case), exactly one space, and a token
/// of printable ASCII without spaces; anything else is no token.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let v = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = v.split_at_checked(7)?;
    let ok = scheme.eq_ignore_ascii_case(b"bearer ")
        && !token.is_empty()
        && token.iter().all(|b| (0x21..=0x7e).contains(b));
    ok.then_some(token)
}

/// Which token an endpoint wants.
#[derive(Clone, Copy)]
enum Scope {
    Host,
    Vm,
}

/// A 401 that says which token the endpoint wants and which kind it got (never the token).
fn unauthorized(want: Scope, got: TokenKind) -> ApiError {
    let want = match want {
        Scope::Host => "the host admin token",
        Scope::Vm => "a VM's admin token (the VM is the token's)",
    };
    err(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        format!("this endpoint wants {want}; the request has {got}"),
    )
}

fn host_auth(state: &ServerState, headers: &HeaderMap) -> ApiResult<()> {
    match bearer(headers) {
        Some(t) if state.registry.is_host(t) => Ok(()),
        t => Err(unauthorized(Scope::Host, state.registry.kind_of(t))),
    }
}

fn vm_auth(state: &ServerState, headers: &HeaderMap) -> ApiResult<Arc<Registration>> {
    let t = bearer(headers);
    t.and_then(|t| state.registry.authenticate_admin(t))
        .ok_or_else(|| unauthorized(Scope::Vm, state.registry.kind_of(t)))
}

/// The 401 of a registration revoked while its request ran.
fn revoked(reg: &Registration) -> ApiError {
    unauthorized(Scope::Vm, TokenKind::Retired(reg.vm))
}

/// Runs a VM-scope engine call on the blocking pool, inside the registration of the request's admin
/// token (a registration revoked meanwhile answers 401, as an unknown token does).
async fn vm_scoped<T: Send + 'static>(
    state: &Arc<ServerState>,
    headers: &HeaderMap,
    f: impl FnOnce(&ServerState, VmId) -> Result<T, CacheError> + Send + 'static,
) -> ApiResult<T> {
    let reg = vm_auth(state, headers)?;
    let st = state.clone();
    tokio::task::spawn_blocking(move || {
        let Some(_live) = reg.enter() else { return Err(revoked(&reg)) };
        f(&st, reg.vm).map_err(ApiError::from)
    })
    .await
    .map_err(|e| err(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
}

/// Runs an engine call on the blocking pool.
async fn blocking<T: Send + 'static>(
    state: &Arc<ServerState>,
    f: impl FnOnce(&ServerState) -> Result<T, CacheError> + Send + 'static,
) -> ApiResult<T> {
    registration_change(state, move |s| f(s).map_err(PersistError::from)).await
}

/// Runs a registration change (which also writes the registrations file) on the blocking pool.
async fn registration_change<T: Send + 'static>(
    state: &Arc<ServerState>,
    f: impl FnOnce(&ServerState) -> Result<T, PersistError> + Send + 'static,
) -> ApiResult<T> {
    let st = state.clone();
    tokio::task::spawn_blocking(move || f(&st))
        .await
        .map_err(|e| err(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
        .map_err(ApiError::from)
}

pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/host", get(get_host).patch(patch_host))
        .route("/v1/stats", get(host_stats))
        .route("/v1/host/coop", get(coop_report))
        .route("/v1/host/coop/publish", axum::routing::post(coop_publish))
        .route("/v1/vms", get(list_vms).post(add_vm))
        .route("/v1/vms/{vm}", get(get_vm).delete(remove_vm))
        .route("/v1/vms/{vm}/weights", put(set_weights))
        .route("/v1/vms/{vm}/tokens", axum::routing::post(replace_tokens))
        .route("/v1/vms/{vm}/quota", put(set_quota))
        .route("/v1/vm/pools", get(list_pools).post(create_pool))
        .route("/v1/vm/pools/{pool}", get(get_pool).delete(destroy_pool))
        .route("/v1/vm/pools/{pool}/spec", put(set_spec))
        .route("/v1/vm/stats", get(vm_stats))
        .route("/v1/vm/provisioner", get(get_own_report).put(put_own_report))
        .route("/v1/provisioner", get(list_reports))
        .route("/v1/history", get(host_history))
        .route("/v1/vm/history", get(own_history))
        .route("/v1/vm/pools/{pool}/label", put(set_label))
        .merge(crate::ui::router())
        .fallback(|| async { err(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            err(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok" }))
}

async fn metrics(State(s): St, headers: HeaderMap) -> ApiResult<Response> {
    host_auth(&s, &headers)?;
    let st = s.clone();
    let text = tokio::task::spawn_blocking(move || {
        let coop = st.coop.get().map(|c| c.report());
        let reports: Vec<_> =
            st.provisioner.all().into_iter().filter(|r| st.registry.contains(VmId(r.vm))).collect();
        let tables = st.table_sizes();
        st.metrics.render(
            &st.cache.host_stats(),
            st.cache.ssd_io_stats().as_ref(),
            coop.as_ref(),
            &reports,
            &tables,
        )
    })
    .await
    .map_err(|e| err(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        .into_response())
}

// ---------------------------------------------------------------------------------------------
// Host scope
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Serialize, Deserialize)]
pub struct StoreInfo {
    pub kind: StoreKind,
    pub configured: bool,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct HostInfo {
    /// This start's instance id (what HELLO returns), as 16 hex digits.
    pub instance: String,
    pub page_size_bytes: usize,
    pub mode: Mode,
    pub eviction_batch_bytes: u64,
    pub stores: Vec<StoreInfo>,
    pub vms: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostPatch {
    mem_capacity_bytes: Option<u64>,
    ssd_capacity_bytes: Option<u64>,
    mode: Option<Mode>,
    eviction_batch_bytes: Option<u64>,
}

fn host_info(s: &ServerState) -> HostInfo {
    let h = s.cache.host_stats();
    let ps = h.page_size as u64;
    HostInfo {
        instance: format!("{:016x}", s.instance),
        page_size_bytes: h.page_size,
        mode: h.mode,
        eviction_batch_bytes: h.eviction_batch_pages * ps,
        stores: h
            .stores
            .iter()
            .map(|st| StoreInfo {
                kind: st.kind,
                configured: st.configured,
                capacity_bytes: st.capacity_pages * ps,
                used_bytes: st.used_pages * ps,
            })
            .collect(),
        vms: h.vms.len(),
    }
}

async fn get_host(State(s): St, headers: HeaderMap) -> ApiResult<Json<HostInfo>> {
    host_auth(&s, &headers)?;
    Ok(Json(host_info(&s)))
}

async fn patch_host(
    State(s): St,
    headers: HeaderMap,
    body: Result<Json<HostPatch>, JsonRejection>,
) -> ApiResult<Json<HostInfo>> {
    host_auth(&s, &headers)?;
    let Json(p) = body?;
    let info = blocking(&s, move |s| {
        if let Some(b) = p.eviction_batch_bytes {
            s.cache.set_eviction_batch(b)?;
        }
        if let Some(m) = p.mode {
            s.cache.set_mode(m);
        }
        if let Some(b) = p.mem_capacity_bytes {
            s.cache.set_capacity(StoreKind::Mem, b)?;
        }
        if let Some(b) = p.ssd_capacity_bytes {
            s.cache.set_capacity(StoreKind::Ssd, b)?;
        }
        Ok(host_info(s))
    })
    .await?;
    Ok(Json(info))
}

async fn host_stats(State(s): St, headers: HeaderMap) -> ApiResult<Json<dd_engine::HostStats>> {
    host_auth(&s, &headers)?;
    Ok(Json(blocking(&s, |s| Ok(s.cache.host_stats())).await?))
}

fn coop_of(s: &ServerState) -> ApiResult<std::sync::Arc<dyn crate::coop_types::CoopHandle>> {
    s.coop
        .get()
        .cloned()
        .ok_or_else(|| err(StatusCode::NOT_FOUND, "not_found", "co-operative de-duplication is not enabled"))
}

async fn coop_report(State(s): St, headers: HeaderMap) -> ApiResult<Json<crate::coop_types::CoopReport>> {
    host_auth(&s, &headers)?;
    Ok(Json(coop_of(&s)?.report()))
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PublishResult {
    /// Peers that accepted the summary.
    pub peers_reached: usize,
}

/// Rebuilds and pushes the summary now (tests and operators; the periodic publication goes on).
async fn coop_publish(State(s): St, headers: HeaderMap) -> ApiResult<Json<PublishResult>> {
    host_auth(&s, &headers)?;
    let c = coop_of(&s)?;
    let n = tokio::task::spawn_blocking(move || c.publish())
        .await
        .map_err(|e| err(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    Ok(Json(PublishResult { peers_reached: n }))
}

#[derive(Debug, Serialize, Deserialize)]
pub struct VmInfo {
    pub id: u32,
    pub weights: VmWeights,
    pub pools: usize,
    /// The VM's pool quota.
    pub max_pools: usize,
    /// The de-duplication group it shares content with; `None`: its own domain.
    pub dedup_group: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewVm {
    id: u32,
    weights: Option<VmWeights>,
    max_pools: Option<usize>,
    dedup_group: Option<String>,
    data_token: Option<String>,
    admin_token: Option<String>,
}

/// The answer to registering a VM: the only time the tokens are shown.
#[derive(Debug, Serialize, Deserialize)]
pub struct VmCredentials {
    pub id: u32,
    pub weights: VmWeights,
    pub data_token: String,
    pub admin_token: String,
}

fn vm_info(s: &ServerState, vm: VmId) -> Result<VmInfo, CacheError> {
    let weights = s.cache.vms().into_iter().find(|(id, _)| *id == vm).ok_or(CacheError::UnknownVm(vm))?.1;
    let group = s.dedup_group_of(vm);
    Ok(VmInfo {
        id: vm.0,
        weights,
        pools: s.cache.pools(vm)?.len(),
        max_pools: s.cache.vm_pool_quota(vm)?,
        dedup_group: (!group.is_empty()).then_some(group),
    })
}

async fn list_vms(State(s): St, headers: HeaderMap) -> ApiResult<Json<Vec<VmInfo>>> {
    host_auth(&s, &headers)?;
    let vms = s.cache.vms().into_iter().filter_map(|(id, _)| vm_info(&s, id).ok()).collect();
    Ok(Json(vms))
}

async fn add_vm(
    State(s): St,
    headers: HeaderMap,
    body: Result<Json<NewVm>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<VmCredentials>)> {
    host_auth(&s, &headers)?;
    let Json(n) = body?;
    if let Some(p) = n.dedup_group.as_deref().and_then(crate::config::group_name_problem) {
        return Err(CacheError::InvalidConfig { field: "dedup_group".into(), reason: p.into() }.into());
    }
    let (data_token, admin_token) = new_tokens(&s, n.data_token, n.admin_token, None)?;
    let cfg = VmConfig {
        id: n.id,
        weights: n.weights.unwrap_or(VmWeights::equal(100)),
        data_token,
        admin_token,
        max_pools: n.max_pools,
        dedup_group: n.dedup_group.unwrap_or_default(),
    };
    let cfg2 = cfg.clone();
    registration_change(&s, move |s| s.add_vm(&cfg2)).await?;
    Ok((
        StatusCode::CREATED,
        Json(VmCredentials {
            id: cfg.id,
            weights: cfg.weights,
            data_token: cfg.data_token,
            admin_token: cfg.admin_token,
        }),
    ))
}

/// The tokens of a registration: the given ones checked (printable ASCII, 16 to 256 characters, unique
/// except among `vm`'s own, which they replace), the missing ones generated.
fn new_tokens(
    s: &ServerState,
    data: Option<String>,
    admin: Option<String>,
    vm: Option<VmId>,
) -> ApiResult<(String, String)> {
    let bad = |field: &str, reason: &str| {
        ApiError::from(CacheError::InvalidConfig { field: field.into(), reason: reason.into() })
    };
    let data_token = data.unwrap_or_else(crate::auth::generate_token);
    let admin_token = admin.unwrap_or_else(crate::auth::generate_token);
    for (field, t) in [("data_token", &data_token), ("admin_token", &admin_token)] {
        if let Some(p) = token_problem(t) {
            return Err(bad(field, p));
        }
        if s.registry.token_in_use(t, vm) {
            return Err(bad(field, "already in use"));
        }
    }
    if data_token == admin_token {
        return Err(bad("admin_token", "must differ from data_token"));
    }
    Ok((data_token, admin_token))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTokens {
    data_token: Option<String>,
    admin_token: Option<String>,
}

/// Replaces a VM's tokens (pools stay): every session and admin credential of the old ones is cut off
/// before the answer, which is the only place the new tokens appear.
async fn replace_tokens(
    State(s): St,
    headers: HeaderMap,
    vm: Result<Path<u32>, PathRejection>,
    body: Result<Json<NewTokens>, JsonRejection>,
) -> ApiResult<Json<VmCredentials>> {
    host_auth(&s, &headers)?;
    let Path(vm) = vm?;
    let Json(n) = body?;
    if !s.registry.contains(VmId(vm)) {
        return Err(CacheError::UnknownVm(VmId(vm)).into());
    }
    let (data_token, admin_token) = new_tokens(&s, n.data_token, n.admin_token, Some(VmId(vm)))?;
    let (d, a) = (data_token.clone(), admin_token.clone());
    let info = registration_change(&s, move |s| {
        s.replace_tokens(VmId(vm), &d, &a)?;
        Ok::<_, PersistError>(vm_info(s, VmId(vm))?)
    })
    .await?;
    Ok(Json(VmCredentials { id: vm, weights: info.weights, data_token, admin_token }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Quota {
    max_pools: usize,
}

/// Sets a VM's pool quota (pools beyond a lowered quota stay; the VM creates none until under it).
async fn set_quota(
    State(s): St,
    headers: HeaderMap,
    vm: Result<Path<u32>, PathRejection>,
    body: Result<Json<Quota>, JsonRejection>,
) -> ApiResult<Json<VmInfo>> {
    host_auth(&s, &headers)?;
    let Path(vm) = vm?;
    let Json(q) = body?;
    let info = registration_change(&s, move |s| {
        s.set_vm_pool_quota(VmId(vm), q.max_pools)?;
        Ok::<_, PersistError>(vm_info(s, VmId(vm))?)
    })
    .await?;
    Ok(Json(info))
}

async fn get_vm(
    State(s): St,
    headers: HeaderMap,
    vm: Result<Path<u32>, PathRejection>,
) -> ApiResult<Json<VmInfo>> {
    host_auth(&s, &headers)?;
    let Path(vm) = vm?;
    Ok(Json(vm_info(&s, VmId(vm))?))
}

async fn remove_vm(
    State(s): St,
    headers: HeaderMap,
    vm: Result<Path<u32>, PathRejection>,
) -> ApiResult<StatusCode> {
    host_auth(&s, &headers)?;
    let Path(vm) = vm?;
    registration_change(&s, move |s| s.remove_vm(VmId(vm))).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn set_weights(
    State(s): St,
    headers: HeaderMap,
    vm: Result<Path<u32>, PathRejection>,
    body: Result<Json<VmWeights>, JsonRejection>,
) -> ApiResult<Json<VmInfo>> {
    host_auth(&s, &headers)?;
    let Path(vm) = vm?;
    let Json(w) = body?;
    let info = registration_change(&s, move |s| {
        s.set_vm_weights(VmId(vm), w)?;
        Ok::<_, PersistError>(vm_info(s, VmId(vm))?)
    })
    .await?;
    Ok(Json(info))
}

// ---------------------------------------------------------------------------------------------
// VM scope
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewPool {
    kind: Option<PoolKind>,
    spec: Spec,
    order: Option<EvictionOrder>,
    exclusive_gets: Option<bool>,
}

async fn list_pools(State(s): St, headers: HeaderMap) -> ApiResult<Json<Vec<dd_engine::PoolStats>>> {
    Ok(Json(vm_scoped(&s, &headers, move |s, vm| Ok(s.cache.vm_stats(vm)?.pools)).await?))
}

async fn create_pool(
    State(s): St,
    headers: HeaderMap,
    body: Result<Json<NewPool>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<dd_engine::PoolStats>)> {
    vm_auth(&s, &headers)?;
    let Json(n) = body?;
    let mut opts = match n.kind.unwrap_or(PoolKind::Ephemeral) {
        PoolKind::Ephemeral => PoolOptions::ephemeral(n.spec),
        PoolKind::Persistent => PoolOptions::persistent(n.spec),
    };
    opts.order = n.order.unwrap_or_default();
    if let Some(x) = n.exclusive_gets {
        opts.exclusive_gets = x;
    }
    let stats = vm_scoped(&s, &headers, move |s, vm| {
        let id = s.cache.new_pool(vm, opts)?;
        s.cache.pool_stats(vm, id)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(stats)))
}

async fn get_pool(
    State(s): St,
    headers: HeaderMap,
    pool: Result<Path<u32>, PathRejection>,
) -> ApiResult<Json<dd_engine::PoolStats>> {
    vm_auth(&s, &headers)?;
    let Path(pool) = pool?;
    Ok(Json(vm_scoped(&s, &headers, move |s, vm| s.cache.pool_stats(vm, PoolId(pool))).await?))
}

async fn destroy_pool(
    State(s): St,
    headers: HeaderMap,
    pool: Result<Path<u32>, PathRejection>,
) -> ApiResult<StatusCode> {
    vm_auth(&s, &headers)?;
    let Path(pool) = pool?;
    vm_scoped(&s, &headers, move |s, vm| s.cache.destroy_pool(vm, PoolId(pool))).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn set_spec(
    State(s): St,
    headers: HeaderMap,
    pool: Result<Path<u32>, PathRejection>,
    body: Result<Json<Spec>, JsonRejection>,
) -> ApiResult<Json<dd_engine::PoolStats>> {
    vm_auth(&s, &headers)?;
    let Path(pool) = pool?;
    let Json(spec) = body?;
    let stats = vm_scoped(&s, &headers, move |s, vm| {
        s.cache.set_spec(vm, PoolId(pool), spec)?;
        s.cache.pool_stats(vm, PoolId(pool))
    })
    .await?;
    Ok(Json(stats))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewLabel {
    /// `None` or empty: the pool's label is taken away.
    label: Option<String>,
}

/// Names a pool (what `guest watch` does over the data plane with SET_LABEL).
async fn set_label(
    State(s): St,
    headers: HeaderMap,
    pool: Result<Path<u32>, PathRejection>,
    body: Result<Json<NewLabel>, JsonRejection>,
) -> ApiResult<Json<dd_engine::PoolStats>> {
    vm_auth(&s, &headers)?;
    let Path(pool) = pool?;
    let Json(n) = body?;
    let stats = vm_scoped(&s, &headers, move |s, vm| {
        s.cache.set_pool_label(vm, PoolId(pool), n.label.as_deref().filter(|l| !l.is_empty()))?;
        s.cache.pool_stats(vm, PoolId(pool))
    })
    .await?;
    Ok(Json(stats))
}

async fn vm_stats(State(s): St, headers: HeaderMap) -> ApiResult<Json<dd_engine::VmStats>> {
    Ok(Json(vm_scoped(&s, &headers, move |s, vm| s.cache.vm_stats(vm)).await?))
}

// ---------------------------------------------------------------------------------------------
// Guest provisioners' reports (`crate::provisioner`)
// ---------------------------------------------------------------------------------------------

fn no_report() -> ApiError {
    err(StatusCode::NOT_FOUND, "no_report", "no provisioner has reported for this VM")
}

/// VM scope: the VM's provisioner reports its last round (checked, then kept while the registration the
/// token belongs to is live).
async fn put_own_report(
    State(s): St,
    headers: HeaderMap,
    body: Result<Json<RoundReport>, JsonRejection>,
) -> ApiResult<Json<StoredReport>> {
    let reg = vm_auth(&s, &headers)?;
    let Json(r) = body?;
    r.validate().map_err(|e| err(StatusCode::BAD_REQUEST, "invalid_report", e.to_string()))?;
    let Some(_live) = reg.enter() else { return Err(revoked(&reg)) };
    Ok(Json(s.provisioner.put(reg.vm, r)))
}

async fn get_own_report(State(s): St, headers: HeaderMap) -> ApiResult<Json<StoredReport>> {
    let reg = vm_auth(&s, &headers)?;
    let Some(_live) = reg.enter() else { return Err(revoked(&reg)) };
    s.provisioner.get(reg.vm).map(Json).ok_or_else(no_report)
}

/// Host scope: every registered VM's last report.
async fn list_reports(State(s): St, headers: HeaderMap) -> ApiResult<Json<Vec<StoredReport>>> {
    host_auth(&s, &headers)?;
    Ok(Json(s.provisioner.all().into_iter().filter(|r| s.registry.contains(VmId(r.vm))).collect()))
}

// ---------------------------------------------------------------------------------------------
// History of the samples (`crate::history`): what `/ui/` charts
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    /// Only samples taken after this time (milliseconds since the Unix epoch); default all.
    #[serde(default)]
    since_unix_ms: u64,
}

/// Host scope: every VM's and pool's kept samples.
async fn host_history(
    State(s): St,
    headers: HeaderMap,
    q: Result<Query<HistoryQuery>, QueryRejection>,
) -> ApiResult<Json<crate::history::HistoryReport>> {
    host_auth(&s, &headers)?;
    let Query(q) = q?;
    Ok(Json(s.history.report(None, q.since_unix_ms)))
}

/// VM scope: the token's VM only.
async fn own_history(
    State(s): St,
    headers: HeaderMap,
    q: Result<Query<HistoryQuery>, QueryRejection>,
) -> ApiResult<Json<crate::history::HistoryReport>> {
    let reg = vm_auth(&s, &headers)?;
    let Query(q) = q?;
    let Some(_live) = reg.enter() else { return Err(revoked(&reg)) };
    Ok(Json(s.history.report(Some(reg.vm), q.since_unix_ms)))
}

//! `/ui/`: the live page of the admin API. Its three assets (HTML, script, style) are compiled into the
//! binary and served as they are; the page fetches nothing from outside the daemon (its Content Security
//! Policy allows only the daemon's own origin). The page itself is public (it holds no data); what it
//! shows comes from `/v1/stats` or `/v1/vm/stats` with the token the user gives it, so the host token
//! sees every VM and a VM's admin token that VM only, exactly as the API does.

use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

/// Same origin only: no outside script, style, image or connection, no framing by other sites.
const CSP: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                   frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The routes of the page, merged into the admin API's router.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/ui/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
}

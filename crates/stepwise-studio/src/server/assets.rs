//! The page and everything it loads, compiled into the binary: nothing is fetched from
//! anywhere but this server (KaTeX 0.19.1 and its fonts are bundled, MIT licence alongside).

use super::Shared;
use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

macro_rules! fonts {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_bytes!(concat!("../../assets/katex/fonts/", $name)) as &[u8])),*]
    };
}

const FONTS: &[(&str, &[u8])] = fonts![
    "KaTeX_AMS-Regular.woff2",
    "KaTeX_Caligraphic-Bold.woff2",
    "KaTeX_Caligraphic-Regular.woff2",
    "KaTeX_Fraktur-Bold.woff2",
    "KaTeX_Fraktur-Regular.woff2",
    "KaTeX_Main-Bold.woff2",
    "KaTeX_Main-BoldItalic.woff2",
    "KaTeX_Main-Italic.woff2",
    "KaTeX_Main-Regular.woff2",
    "KaTeX_Math-BoldItalic.woff2",
    "KaTeX_Math-Italic.woff2",
    "KaTeX_SansSerif-Bold.woff2",
    "KaTeX_SansSerif-Italic.woff2",
    "KaTeX_SansSerif-Regular.woff2",
    "KaTeX_Script-Regular.woff2",
    "KaTeX_Size1-Regular.woff2",
    "KaTeX_Size2-Regular.woff2",
    "KaTeX_Size3-Regular.woff2",
    "KaTeX_Size4-Regular.woff2",
    "KaTeX_Typewriter-Regular.woff2",
];

fn asset(content_type: &'static str, body: &'static [u8]) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn font(Path(name): Path<String>) -> Response {
    match FONTS.iter().find(|(n, _)| *n == name) {
        Some((_, bytes)) => asset("font/woff2", bytes),
        None => (StatusCode::NOT_FOUND, "no such font").into_response(),
    }
}

pub(super) fn routes() -> Router<Shared> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", include_bytes!("../../assets/index.html")) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", include_bytes!("../../assets/app.js")) }),
        )
        .route(
            "/assets/app.css",
            get(|| async { asset("text/css; charset=utf-8", include_bytes!("../../assets/app.css")) }),
        )
        .route(
            "/assets/katex/katex.min.js",
            get(|| async {
                asset(
                    "text/javascript; charset=utf-8",
                    include_bytes!("../../assets/katex/katex.min.js"),
                )
            }),
        )
        .route(
            "/assets/katex/katex.min.css",
            get(|| async {
                asset(
                    "text/css; charset=utf-8",
                    include_bytes!("../../assets/katex/katex.min.css"),
                )
            }),
        )
        .route("/assets/katex/fonts/{name}", get(font))
}

//! `receiver.json`: the receiver's guard: the `Idempotency-Key` header rule
//! and the digests of the HTTP request and response documents
//! (`retryledger.http_request.v1`, `retryledger.http_response.v1`) that an
//! idempotency record holds, so every host computes the same ones.

use retryledger_core::api;
use serde_json::json;

use crate::family::Family;

fn request(f: &mut Family, name: &str, method: &str, target: &str, body: &str) -> String {
    let want = api::http_request_sha256(method, target, body.as_bytes());
    f.add(
        name,
        "http_request_sha256",
        vec![
            ("method", json!(method)),
            ("target", json!(target)),
            ("body", json!(body)),
        ],
        &want,
    );
    want
}

fn response(f: &mut Family, name: &str, status: u64, headers: &str, body: &str, want: &str) {
    f.add(
        name,
        "http_response_sha256",
        vec![
            ("status", json!(status)),
            ("headers", json!(headers)),
            ("body", json!(body)),
        ],
        want,
    );
}

fn header(f: &mut Family, name: &str, raw: &str, want: &str) {
    f.add(
        name,
        "check_idempotency_header",
        vec![("raw", json!(raw))],
        want,
    );
}

pub fn family() -> Family {
    let mut f = Family::new(
        "receiver",
        "check_idempotency_header / http_request_sha256 / http_response_sha256: the receiver's guard (docs/RECEIVER.md): the Idempotency-Key header rule (1 to 255 printable ASCII characters) and the digests an idempotency record holds: of the request as received (retryledger.http_request.v1: method in upper case, path and query, body digest) and of the response as sent (retryledger.http_response.v1: status, kept headers as lower-case [name, value] pairs, body digest). Bodies are the UTF-8 bytes of `body`.",
        "keys at and past each bound, control and non-ASCII characters; methods in any case, targets with a query and non-ASCII, empty and non-ASCII bodies; each digest the digest of its document; responses with and without headers, statuses out of range, header names not in lower case, headers that are not string pairs",
    );

    header(&mut f, "a_plain_key", "order-42", "ok");
    header(&mut f, "space_and_tilde_are_printable", " ~", "ok");
    header(&mut f, "255_characters", &"k".repeat(255), "ok");
    header(&mut f, "empty_key", "", "idempotency_key_invalid");
    header(
        &mut f,
        "256_characters",
        &"k".repeat(256),
        "idempotency_key_invalid",
    );
    header(&mut f, "a_tab", "a\tb", "idempotency_key_invalid");
    header(&mut f, "delete", "a\u{7f}", "idempotency_key_invalid");
    header(&mut f, "non_ascii", "clé", "idempotency_key_invalid");

    let post = request(
        &mut f,
        "post_json",
        "POST",
        "/orders?x=1",
        "{\"sku\":\"a\"}",
    );
    let lower = request(
        &mut f,
        "method_in_lower_case",
        "post",
        "/orders?x=1",
        "{\"sku\":\"a\"}",
    );
    assert_eq!(post, lower, "the method's case is not part of the digest");
    let other = request(
        &mut f,
        "another_query",
        "POST",
        "/orders?x=2",
        "{\"sku\":\"a\"}",
    );
    assert_ne!(post, other);
    request(&mut f, "empty_body", "GET", "/", "");
    let unicode = request(
        &mut f,
        "non_ascii_target_and_body",
        "PUT",
        "/café?q=é",
        "größe",
    );
    // Each digest is the SHA-256 of its canonical document's text.
    let document = format!(
        "{{\"body_sha256\":\"{}\",\"method\":\"PUT\",\"schema\":\"retryledger.http_request.v1\",\"target\":\"/café?q=é\"}}",
        retryledger_core::canonical::sha256_hex("größe".as_bytes())
    );
    assert_eq!(
        retryledger_core::canonical::sha256_hex(document.as_bytes()),
        unicode
    );

    let kept = "[[\"content-type\",\"application/json\"],[\"location\",\"/orders/7\"]]";
    let ok = api::http_response_sha256(201, kept, b"{\"id\":7}").expect("response");
    response(
        &mut f,
        "created_with_kept_headers",
        201,
        kept,
        "{\"id\":7}",
        &ok,
    );
    let bare = api::http_response_sha256(204, "[]", b"").expect("response");
    response(&mut f, "no_content_no_headers", 204, "[]", "", &bare);
    let document = format!(
        "{{\"body_sha256\":\"{}\",\"headers\":[[\"content-type\",\"application/json\"],[\"location\",\"/orders/7\"]],\"schema\":\"retryledger.http_response.v1\",\"status\":201}}",
        retryledger_core::canonical::sha256_hex(b"{\"id\":7}")
    );
    assert_eq!(
        retryledger_core::canonical::sha256_hex(document.as_bytes()),
        ok
    );
    response(&mut f, "status_below_100", 99, "[]", "", "invalid_value");
    response(&mut f, "status_above_999", 1000, "[]", "", "invalid_value");
    response(
        &mut f,
        "header_name_not_lower_case",
        200,
        "[[\"Content-Type\",\"text/plain\"]]",
        "",
        "/headers/0/0",
    );
    response(
        &mut f,
        "header_not_a_pair",
        200,
        "[[\"a\"]]",
        "",
        "/headers/0",
    );
    response(&mut f, "headers_not_an_array", 200, "{}", "", "/headers");
    f
}
